"""optimize() as named steps: the one relative gap, and the per-stage records a plan carries."""

import msgspec
import pytest

from fleetplan.solver.backends import relative_gap
from fleetplan.solver.backends.base import SolveResult, Termination


@pytest.mark.parametrize(
    ("objective", "bound", "gap"),
    [
        (100.0, 101.0, 0.01),
        (100.0, 99.0, 0.01),  # a min stage: the bound lies below
        (5.0, 5.0, 0.0),  # equal
        (0.0, 0.0, 0.0),  # 0 objective, closed
        (1e6, 1e6 + 5e-10, 0.0),  # within the 1e-9 absolute tolerance
        (-10.0, -9.0, 0.1),  # negative: over |objective|
        (-10.0, -11.0, 0.1),
        (-1e-3, 1e-3, 2.0),  # across zero
        (0.5, 0.6, 0.2),  # below 1 in magnitude: over |objective|, not over 1
    ],
)
def test_relative_gap(objective, bound, gap):
    assert relative_gap(objective, bound) == pytest.approx(gap, rel=1e-12, abs=1e-15)


def test_relative_gap_of_a_zero_objective_with_an_open_bound_is_large():
    assert relative_gap(0.0, 2e-9) == pytest.approx(2.0)
    assert relative_gap(0.0, 1.0) == pytest.approx(1e9)
    assert relative_gap(0.0, -1.0) == pytest.approx(1e9)


def test_relative_gap_is_none_without_an_objective_or_a_bound():
    assert relative_gap(None, 1.0) is None
    assert relative_gap(1.0, None) is None
    assert relative_gap(None, None) is None


def test_solve_result_gap_is_relative_gap():
    result = SolveResult(Termination.FEASIBLE, None, 0.5, 0.4, 0.0)
    assert result.gap == relative_gap(0.5, 0.4) == pytest.approx(0.2)


# ------------------------------------------------------------------------------------ per-stage records


@pytest.fixture(scope="module")
def credited_plan():
    """The plan of the bundled link_bound request (one whose pooled credit, solver/pooled.py, serves more
    than the MILP), with every backend call optimize() and the credit made (module-scoped)."""
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver import optimize as optimize_module
    from fleetplan.solver import plan
    from fleetplan.solver import pooled as pooled_module
    from fleetplan.solver import window as window_module

    calls = []
    real = optimize_module.get_backend

    class Counting:
        def __init__(self, backend):
            self.backend, self.name = backend, backend.name

        def solve(self, form, objective, sense, **kwargs):
            result = self.backend.solve(form, objective, sense, **kwargs)
            calls.append((kwargs.get("relax", False), result))
            return result

    modules = (optimize_module, pooled_module, window_module)
    for module in modules:
        module.get_backend = lambda name: Counting(real(name))
    try:
        result = plan(read_request(fixtures.request_path("link_bound")), with_baselines=False)
    finally:
        for module in modules:
            module.get_backend = real
    return result, calls


def test_a_plan_carries_a_record_per_solver_call(credited_plan):
    result, calls = credited_plan
    stages = result.solver.stages
    assert stages, "SolverInfo.stages is empty"
    assert len(stages) == len(calls)
    for record, (relax, solved) in zip(stages, calls, strict=True):
        assert record.kind == "lp" if relax else record.kind in ("submip", "mip")
        assert record.termination == str(solved.termination)
        assert record.objective == solved.objective
        assert record.bound == solved.bound
        assert record.gap == relative_gap(solved.objective, solved.bound)
        assert record.nodes == solved.nodes
    steps = [r.step for r in stages]
    assert steps[0] == "relaxation"
    assert "primary" in steps
    assert steps.index("primary") > max(i for i, s in enumerate(steps) if s in ("relaxation", "start"))
    # then the tie-breaks, the pooled credit's LPs where it served more (solver/pooled.py: one, and one
    # per pool shape tried as one pool), and last the window guard's where it lowered a pool
    # (solver/window.py; link_bound runs a decode pool at its full-batch rate)
    after = steps[steps.index("primary") + 1 :]
    order = {"tie_break": 0, "pooled": 1, "window": 2}
    assert all(s in order for s in after)
    assert [order[s] for s in after] == sorted(order[s] for s in after)
    assert "pooled" in after
    assert steps[-1] == "window"
    # max_goodput: goodput, then the cost tie-break
    assert [(r.step, r.stage) for r in stages if r.step in ("primary", "tie_break")] == [
        ("primary", "goodput"),
        ("tie_break", "cost"),
    ]
    primary = next(r for r in stages if r.step == "primary")
    assert primary.kind == "mip"
    assert primary.nodes is not None
    assert primary.nodes >= 0
    assert all(r.nodes is None for r in stages if r.kind == "lp")


def test_stage_times_fit_in_the_solve_time(credited_plan):
    result, _ = credited_plan
    stages = result.solver.stages
    rounding = 1e-3 * len(stages)  # each ms is rounded to 3 decimals
    assert all(r.ms >= 0 for r in stages)
    assert sum(r.ms for r in stages) <= result.solver.solve_ms + rounding
    ended = [r.ended_ms for r in stages]
    assert ended == sorted(ended)
    # the calls run one after another within optimize(), which began before the first
    assert ended[-1] >= sum(r.ms for r in stages) - rounding


def test_the_final_stages_match_the_plan_within_the_gap(credited_plan):
    result, _ = credited_plan
    stages = result.solver.stages
    primary = next(r for r in stages if r.step == "primary")
    final = [r for r in stages if r.step in ("primary", "tie_break")][-1]
    # the primary stage is what the plan reports as its objective, value and bound
    assert primary.bound == result.objective_bound
    assert primary.gap == result.mip_gap
    tolerance = (result.mip_gap or 0.0) + 1e-6
    # the plan's value: the primary MIP's, or what the pooled credit served on the same instances
    pooled = [r for r in stages if r.step == "pooled"]
    served = max(r.objective for r in pooled) if pooled else primary.objective  # the credit keeps the best
    assert result.objective_value == pytest.approx(served, rel=tolerance)
    if pooled:
        assert served > primary.objective
    # the last stage (the cost tie-break) is the plan kept: its objective is the plan's cost
    assert final.stage == "cost"
    assert result.cost_per_hour == pytest.approx(final.objective, rel=(final.gap or 0.0) + 1e-6)


def test_a_plan_without_candidates_has_no_stages():
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver.pipeline import _solver_info

    assert _solver_info(read_request(fixtures.request_path("paper")), None).stages is None


def test_stage_records_round_trip_through_json(credited_plan):
    import msgspec

    from fleetplan.models.plan import Plan

    result, _ = credited_plan
    decoded = msgspec.json.decode(msgspec.json.encode(result), type=Plan)
    assert decoded.solver.stages == result.solver.stages


@pytest.fixture
def tuning_seen(monkeypatch):
    """Every backend call's `tuning` (and whether it was a relaxation), in order, as the highs backend got
    them; and paper.json's candidates, built once per test."""
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver.backends import highs
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.pipeline import resolve_profiles

    seen: list[tuple[object, bool]] = []
    solve = highs.HighsBackend.solve

    def spy(self, form, objective, sense, **kwargs):
        seen.append((kwargs.get("tuning"), bool(kwargs.get("relax"))))
        return solve(self, form, objective, sense, **kwargs)

    monkeypatch.setattr(highs.HighsBackend, "solve", spy)

    def prepare(change=lambda r: r):
        request = change(read_request(fixtures.request_path("paper")))
        return request, build_candidates(request, resolve_profiles(request))

    return seen, prepare


def test_each_call_gets_its_stage_tuning(monkeypatch, tuning_seen):
    """optimize.STAGE_TUNING reaches the backend per (step, stage), then per step; other calls get None."""
    from fleetplan.solver import optimize as optimize_module

    seen, prepare = tuning_seen
    tuning = {"tie_break": {"presolve": "off"}, ("relaxation", "cost"): {"simplex_strategy": 4}}
    monkeypatch.setattr(optimize_module, "STAGE_TUNING", tuning)
    outcome = optimize_module.optimize(*prepare())
    steps = [(r.step, r.stage) for r in outcome.stages]
    assert len(seen) == len(steps)
    for (step, stage), (passed, _) in zip(steps, seen, strict=True):
        assert passed == tuning.get((step, stage), tuning.get(step))
    assert ("tie_break", "cost") in steps
    assert ("relaxation", "cost") in steps


def test_a_budget_lays_its_tuning_over_the_stage_tuning(monkeypatch, tuning_seen):
    """Under budget_per_hour, optimize.BUDGET_TUNING's options replace STAGE_TUNING's for that step only."""
    from fleetplan.solver import optimize as optimize_module

    seen, prepare = tuning_seen
    monkeypatch.setattr(optimize_module, "STAGE_TUNING", {"tie_break": {"presolve": "off", "random_seed": 3}})
    monkeypatch.setattr(optimize_module, "BUDGET_TUNING", {"tie_break": {"presolve": "choose"}})

    def budget(request):
        return msgspec.structs.replace(
            request, options=msgspec.structs.replace(request.options, budget_per_hour=14.0)
        )

    outcome = optimize_module.optimize(*prepare(budget))
    steps = [r.step for r in outcome.stages]
    assert "tie_break" in steps
    for step, (passed, _) in zip(steps, seen, strict=True):
        assert passed == ({"presolve": "choose", "random_seed": 3} if step == "tie_break" else None)


def test_a_cutoff_lays_its_tuning_over_the_primary_and_bounds_start_and_primary(monkeypatch, tuning_seen):
    """optimize_above's search (a floor the plans must beat): its sub-MIP start and its primary MIP get
    HiGHS's objective_bound at the floor (minimizing sense), and the primary optimize.CUTOFF_TUNING's
    options on top of STAGE_TUNING's; the relaxations and tie-breaks neither."""
    from fleetplan.solver import optimize as optimize_module

    seen, prepare = tuning_seen
    monkeypatch.setattr(optimize_module, "STAGE_TUNING", {"primary": {"random_seed": 3}})
    monkeypatch.setattr(optimize_module, "CUTOFF_TUNING", {"primary": {"mip_heuristic_run_rens": False}})

    def one_more_a6000(request):
        devices = [
            msgspec.structs.replace(d, count=d.count + 1) if d.name == "a6000ada" else d
            for d in request.devices
        ]
        return msgspec.structs.replace(request, devices=devices)

    outcome, mip = optimize_module.optimize_above(*prepare(one_more_a6000), 55.0, ("a6000ada", 4))
    assert mip
    assert outcome is not None
    for record, (passed, _) in zip(outcome.stages, seen, strict=True):
        if record.step == "primary":
            assert passed == {"random_seed": 3, "mip_heuristic_run_rens": False, "objective_bound": -55.0}
        elif record.step == "start":
            assert passed == {"objective_bound": -55.0}
        else:
            assert passed is None, record.step


def test_hint_rows_span_the_plan_and_one_instance_less_per_pool():
    import numpy as np

    from fleetplan.solver.optimize import hint_rows

    rows = hint_rows(np.array([0.0, 2.0, 1.0000000001, 3.0]))
    assert rows.tolist() == [[0, 2, 1, 3], [0, 1, 0, 2]]


def test_a_hint_widens_the_sub_mip_box_and_keeps_the_optimum():
    """A higher budget's plan as the hint (what a falling what-if sweep passes): the sub-MIP's box grows,
    so its start is at least the unhinted one's (within the gap), and the MIP's optimum is the same."""
    from form_checks import is_feasible

    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.formulation import build_matrix
    from fleetplan.solver.optimize import optimize
    from fleetplan.solver.pipeline import resolve_profiles

    request = read_request(fixtures.request_path("paper"))

    def at(budget):
        options = msgspec.structs.replace(request.options, budget_per_hour=budget)
        one = msgspec.structs.replace(request, options=options)
        return one, build_candidates(one, resolve_profiles(one))

    above = optimize(*at(15.2))
    request_14, cand_14 = at(14.0)
    form, _ = build_matrix(cand_14)
    assert not is_feasible(form, above.values)  # the higher plan breaks the budget: a hint, not a start
    cold, hinted = optimize(request_14, cand_14), optimize(request_14, cand_14, hint=above.values)

    def start_value(outcome):
        return next(r.objective for r in outcome.stages if r.step == "start")

    gap = request.options.mip_rel_gap
    assert start_value(hinted) >= start_value(cold) * (1 - gap)
    assert hinted.primary_value == pytest.approx(cold.primary_value, rel=gap)
    assert [r.step for r in hinted.stages] == [r.step for r in cold.stages]


def _scarce():
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.pipeline import resolve_profiles

    request = read_request(fixtures.request_path("scarce_gpus"))
    return request, build_candidates(request, resolve_profiles(request))


def test_optimize_fixed_at_the_optimum_counts_keeps_the_optimum_and_at_zero_serves_nothing():
    import numpy as np

    from fleetplan.solver.formulation import instance_units
    from fleetplan.solver.optimize import optimize, optimize_fixed

    request, cand = _scarce()
    best = optimize(request, cand)
    units, _ = instance_units(cand, best.columns)
    held = optimize_fixed(request, cand, {int(c): float(np.round(best.values[c])) for c in units})
    goodput = best.form.objectives["goodput"]
    assert float(goodput @ held.values) == pytest.approx(best.primary_value, rel=request.options.mip_rel_gap)
    assert np.allclose(np.round(held.values[units]), np.round(best.values[units]))
    idle = optimize_fixed(request, cand, {int(c): 0.0 for c in units})
    assert float(goodput @ idle.values) == pytest.approx(0.0, abs=1e-9)


def test_a_fleet_held_at_another_plans_counts_serves_at_most_the_optimum():
    """bench/uniform_gap.py's valuation of the flat plan's fleet: a restriction of the same MILP, so its
    MILP objective is at most the free optimum (within the gap)."""
    from bench.uniform_gap import fleet_under_model, uniform_counts
    from fleetplan.solver.optimize import optimize

    request, cand = _scarce()
    counts, flat_objective = uniform_counts(request, 0.7)
    assert flat_objective > 0
    assert counts
    valued = fleet_under_model(request, counts)
    free = optimize(request, cand).primary_value
    assert 0 < valued["milp"] <= free * (1 + request.options.mip_rel_gap)
    assert valued["credited"] >= valued["milp"] * (1 - 1e-9)  # the credit never serves less
    assert not valued["missing"]
