"""One judged window's scatter: the count model (capacity.window_*) and the guard on plans
(fleetplan/solver/window.py)."""

import numpy as np
import pytest
from scipy.stats import nbinom

from fleetplan.profiler.latency import quantile_ms, quantile_params_array
from fleetplan.solver import capacity, scatter
from fleetplan.solver.pipeline import plan, resolve_profiles

# mistral-7b, 1024-token prompts on one A6000 Ada (the analytic profile's TTFT p50/p90/p99 at batch 1, ms)
PROFILE = (148.719, 158.551, 166.565)


def test_window_breaks_is_the_negative_binomial_tail():
    mean = np.array([0.5, 9.5, 14.2, 140.0, 3.0])
    dispersion = np.array([1.5, 5.0, 14.7, 14.0, 40.0])
    allowed = np.array([1.8, 18.9, 28.4, 283.8, 30.0])
    r = mean / (dispersion - 1.0)
    expected = nbinom.sf(np.floor(allowed), r, 1.0 / dispersion)
    assert scatter.window_breaks(mean, dispersion, allowed) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_window_margin_is_the_largest_that_keeps_a_window_within_delta():
    dispersion = np.array([1.2, 4.0, 15.0, 15.0, 30.0])
    requests = np.array([3000.0, 2000.0, 3000.0, 10000.0, 3000.0])
    tail = np.array([0.1, 0.01, 0.01, 0.01, 0.1])
    margin = scatter.window_margin(dispersion, requests, tail)
    allowed = tail * requests
    at = scatter.window_breaks(margin * allowed, dispersion, allowed)
    step = 2.0 ** (1 - scatter.MARGIN_HALVINGS)
    above = scatter.window_breaks((margin + step) * allowed, dispersion, allowed)
    assert np.all(at <= scatter.WINDOW_DELTA)
    assert np.all(above > scatter.WINDOW_DELTA)
    # more requests in the window: a larger margin; more clustering: a smaller one
    assert margin[3] > margin[2]
    assert margin[2] < scatter.window_margin(np.array([4.0]), np.array([3000.0]), np.array([0.01]))[0]


def test_window_margin_never_grows_with_the_dispersion():
    """A negative binomial of a huge index puts the count in rare bursts, so its own margin grows again
    there; window_margin takes the least over the indices up to the modelled one (which errs high at high
    loads), so a more clustered queue never gets a looser margin (to within its grid of indices)."""
    dispersion = np.geomspace(1.5, 5000.0, 40)
    for requests, tail in ((1440.0, 0.01), (1440.0, 0.1), (3000.0, 0.01)):
        margin = scatter.window_margin(dispersion, np.full(40, requests), np.full(40, tail))
        assert np.all(np.diff(margin) <= 0.01)  # the least over halvings of D - 1: to within that grid
        assert margin[-1] < 0.5 * margin[0]


def test_window_dispersion_grows_with_load_and_spread():
    busy = np.array([0.0, 0.5, 0.7, 0.9])
    near_deterministic = scatter.window_dispersion(busy, np.zeros(4))
    assert near_deterministic[0] == pytest.approx(1.0 + scatter.WINDOW_DISPERSION)
    assert np.all(np.diff(near_deterministic) > 0)
    assert np.all(scatter.window_dispersion(busy, np.ones(4)) > near_deterministic)


def _lindley_ttft(rng, lam_per_ms: float, n: int) -> np.ndarray:
    """An M/G/1 FIFO queue by a plain loop (independent of bench/window_scatter.py's cumulative form)."""
    params = quantile_params_array(*(np.array([v]) for v in PROFILE))[0]
    service = quantile_ms(params, rng.standard_normal(n))
    arrival = np.cumsum(rng.exponential(1.0 / lam_per_ms, n))
    out, free = np.empty(n), 0.0
    for i in range(n):
        start = max(arrival[i], free)
        free = start + service[i]
        out[i] = free - arrival[i]
    return out


def test_a_p99_class_planned_with_the_window_margin_breaks_few_windows():
    """One instance at 0.75 of its full rate, a p99 class: planned at TAIL_MARGIN (p99.5) its 600 s
    windows break the planned level far more often than WINDOW_DELTA; at the window margin
    (scatter.window_margin with the modelled dispersion) close to WINDOW_DELTA."""
    rng = np.random.default_rng(3)
    lam = 0.75 / PROFILE[1]
    per_window, windows = int(lam * capacity.WINDOW_MS), 300
    ttft = _lindley_ttft(rng, lam, per_window * windows)
    window_p99 = np.quantile(ttft.reshape(windows, per_window), 0.99, axis=1)
    params = quantile_params_array(*(np.array([v]) for v in PROFILE))[0]
    mean = float(quantile_ms(params, rng.standard_normal(200_000)).mean())
    dispersion = scatter.window_dispersion(np.array([lam * mean]), np.array([0.0]))
    margin = float(scatter.window_margin(dispersion, np.array([per_window]), np.array([0.01]))[0])
    assert margin < capacity.TAIL_MARGIN
    plain = np.quantile(ttft, 1.0 - capacity.TAIL_MARGIN * 0.01)
    guarded = np.quantile(ttft, 1.0 - margin * 0.01)
    assert (window_p99 > plain).mean() > 0.09
    assert (window_p99 > guarded).mean() < 0.09


def test_window_epsilon_only_tightens_and_only_where_windows_scatter():
    from bench.fidelity import generated
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.headroom import pool_queues

    request = generated(13)
    cand = build_candidates(request, resolve_profiles(request))
    rows = np.flatnonzero((cand.uses["role"] == "prefill").to_numpy())
    t, curves = pool_queues(cand, rows, None)
    low, high = 0.2 * t.rate, 0.8 * t.rate
    many = np.full(len(rows), 1e6)
    few = np.full(len(rows), 2000.0)
    at_many = capacity.prefill_window_epsilon(t.epsilon, low, curves, t.batch, many)
    assert at_many == pytest.approx(t.epsilon)  # light load, a large class: TAIL_MARGIN holds
    at_few = capacity.prefill_window_epsilon(t.epsilon, high, curves, t.batch, few)
    assert np.all(at_few <= t.epsilon + 1e-15)
    p99 = t.epsilon < 0.01
    assert p99.any()
    assert np.all(at_few[p99] < t.epsilon[p99])


def test_decode_window_epsilon_tightens_near_slot_saturation():
    """A decode use's window is its slot queue's: at 97.5% of its full-batch rate (where gen-06's p90 class
    of 256-token outputs broke one window in fifteen, simulated TPOT 78 ms against 75) the planned tail
    falls well below TAIL_MARGIN's; at 30% with a large class it stays."""
    from bench.fidelity import generated
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.headroom import pool_queues

    request = generated(6)
    cand = build_candidates(request, resolve_profiles(request))
    rows = np.flatnonzero(((cand.uses["role"] == "decode") & (cand.uses["w"] == 4)).to_numpy())
    t, curves = pool_queues(cand, rows, None)
    n = len(rows)
    near = capacity.decode_window_epsilon(
        t.epsilon, 0.975 * t.rate, curves, t.batch, t.steps, np.full(n, 2200.0)
    )
    light = capacity.decode_window_epsilon(t.epsilon, 0.3 * t.rate, curves, t.batch, t.steps, np.full(n, 1e6))
    assert np.all(near < 0.5 * t.epsilon)
    assert light == pytest.approx(t.epsilon)


def test_the_guard_lowers_a_p99_classs_prefill_pool_on_the_same_hardware(monkeypatch):
    """Generated request 13 of bench/fidelity.py: a p99 class of 1024-token prompts whose A6000 prefill
    instance the MILP runs at the 0.8 level. Over one window that class has ~4,300 requests; at that load
    the window's p99 scatters (the instance broke its class on one seed of twelve), so the guard lowers the
    pool's headroom and serves less on the same devices, and records its LP as step "window"."""
    from bench.fidelity import generated
    from fleetplan.solver import pipeline, window

    request = generated(13)
    guarded = plan(request, with_baselines=False)
    monkeypatch.setattr(pipeline, "settle", lambda r, c, o, d, **_: window.pool_credit(r, c, o, d))
    plain = plan(request, with_baselines=False)
    assert guarded.slo_rps < plain.slo_rps - 1e-6
    assert [d.used for d in guarded.devices] == [d.used for d in plain.devices]
    assert guarded.cost_per_hour == pytest.approx(plain.cost_per_hour)
    steps = [s.step for s in guarded.solver.stages]
    assert steps[-1] == "window"
    assert "window" not in [s.step for s in plain.solver.stages]
    window_lp = [s.objective for s in guarded.solver.stages if s.step == "window"][-1]
    assert window_lp == pytest.approx(guarded.objective_value, rel=1e-6)  # weighted: in its own units

    def prefill(result):
        return {(p.model, p.device, p.batch): p.headroom for p in result.pools if p.role == "prefill"}

    lowered = {k: v for k, v in prefill(guarded).items() if v < prefill(plain).get(k, 0.0) - 1e-9}
    assert set(lowered) == {("mistral-7b", "a6000ada", 1)}
    assert all(p.utilization <= p.headroom + 1e-9 for p in guarded.pools)


@pytest.mark.parametrize("name", ["paper", "scarce_gpus"])
def test_the_guard_only_lowers_headroom_and_gives_flow_up(name, monkeypatch):
    """The bundled requests run decode pools near their slot capacity, where one window's TPOT scatters:
    the guard lowers some of them. Their plans come from a two-phase tie-break whose form locks goodput at
    the MILP's value (optimize.py's lock row), which the guard's LP must drop (it did not at first, and
    silently changed nothing). It never raises a pool, never routes a class where the plan did not, never
    serves a class more, and keeps the devices and cost."""
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver import pipeline, window

    request = read_request(fixtures.request_path(name))
    guarded = plan(request, with_baselines=False)
    monkeypatch.setattr(pipeline, "settle", lambda r, c, o, d, **_: window.pool_credit(r, c, o, d))
    plain = plan(request, with_baselines=False)
    assert "tie_break" in [s.step for s in plain.solver.stages]
    assert [s.step for s in guarded.solver.stages][-1] == "window"
    assert guarded.slo_rps < plain.slo_rps
    assert [d.used for d in guarded.devices] == [d.used for d in plain.devices]
    assert guarded.cost_per_hour == pytest.approx(plain.cost_per_hour)

    def shape(p):
        return (p.model, p.role, p.device, p.tp, p.batch)

    before = {}
    for p in plain.pools:
        before[shape(p)] = max(before.get(shape(p), 0.0), p.headroom)
    assert all(p.headroom <= before[shape(p)] + 1e-9 for p in guarded.pools)

    def routes(result):
        out = {}
        for w in result.workloads:
            for r in w.routes:
                hops = tuple(
                    None if h is None else (h.device, h.batch) for h in (r.prefill, r.decode, r.colocated)
                )
                out[(w.name, hops)] = out.get((w.name, hops), 0.0) + r.rps
        return out

    assert set(routes(guarded)) <= set(routes(plain))  # flow may shift among the plan's routes, no new ones
    served = {w.name: w.served_rps for w in plain.workloads}
    assert all(w.served_rps <= served[w.name] + 1e-6 for w in guarded.workloads)


def test_a_plan_the_guard_does_not_apply_to_says_where_a_window_may_break():
    """The guard cannot give flow up on a plan that must serve all its demand. On the MILP's first min_cost
    plan of gen-25 (all of whose demand its fleet serves) `unguarded_warnings` names, per pool running
    above what the guard would allow, the pool, its load and the classes it carries: what a plan would
    say that kept it (a min_cost plan whose re-solves ran out does)."""
    import msgspec

    from bench.fidelity import generated
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.extract import solution_from
    from fleetplan.solver.optimize import optimize
    from fleetplan.solver.window import unguarded_warnings

    base = generated(25)
    request = msgspec.structs.replace(
        base, options=msgspec.structs.replace(base.options, objective="min_cost")
    )
    cand = build_candidates(request, resolve_profiles(request))
    outcome = optimize(request, cand)
    notes = unguarded_warnings(request, cand, outcome)
    assert notes
    solution = solution_from(cand, outcome.columns, outcome.values)
    pools = cand.pools
    running = {
        (pools.at[p, "owner"], pools.at[p, "role"], pools.at[p, "device"], int(pools.at[p, "batch"]))
        for p in np.flatnonzero(solution.instances > 0)
    }
    for note in notes:
        head = note.split(" runs at ")[0].removeprefix("window: the ")
        model, role, _, _, device, batch = head.replace("(batch ", "").rstrip(")").split(" ")
        assert (model, role, device, int(batch)) in running
        carried = note.split("window may break ")[1].split(" more than")[0].split(", ")
        assert set(carried) <= {w.name for w in request.workloads}


def test_a_churn_limited_replan_is_guarded_like_a_first_plan():
    """The guard moves no instance, so a churn-limited re-plan gets it too (session 23): paper.json planned,
    then re-planned against that plan in force, carries a "window" step and no window warning. Before,
    the re-plan kept the MILP's headroom (56.05 SLO RPS with a warning against the first plan's 56.01)."""
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver.formulation import Churn

    request = read_request(fixtures.request_path("paper"))
    first = plan(request, with_baselines=False)
    churn = Churn.from_pools(first.pools, request.options.pooling, 4, 0.001)
    again = plan(request, with_baselines=False, churn=churn)
    assert "window" in [s.step for s in again.solver.stages]
    assert not [w for w in again.warnings if w.startswith("window:")]
    assert all(p.utilization <= p.headroom + 1e-9 for p in again.pools)


def test_a_min_cost_plan_is_planned_on_the_guards_headroom():
    """window.optimize_guarded: a min_cost plan serves all its demand, so its classes' requests in one
    window are known before the MILP and every pool is capped up front at the guard's headroom for the
    uses it offers (`prior_tables`). gen-25's first MILP on the tables as they are runs pools above what
    the guard allows (`capped_tables` lowers them: what the backstop rounds would solve again); on the
    capped tables the plan costs at least as much, serves all demand, carries no window warning, and the
    guard lowers nothing more. Before session 23 the plan kept the first MILP's headroom with warnings."""
    import msgspec

    from bench.fidelity import generated
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.optimize import optimize
    from fleetplan.solver.window import capped_tables, optimize_guarded, prior_tables

    base = generated(25)
    request = msgspec.structs.replace(
        base, options=msgspec.structs.replace(base.options, objective="min_cost")
    )
    cand = build_candidates(request, resolve_profiles(request))
    first = optimize(request, cand)
    assert capped_tables(request, cand, first) is not None
    prior = prior_tables(request, cand)
    assert prior is not None
    assert len(prior.pools) <= len(cand.pools)
    guarded = optimize_guarded(request, cand)
    assert guarded.candidates.pools is prior.pools or len(guarded.candidates.pools) == len(prior.pools)
    assert capped_tables(request, guarded.candidates, guarded) is None
    result = plan(request, with_baselines=False)
    assert result.status == "optimal"
    assert result.cost_per_hour >= first.primary_value - 1e-6
    assert all(w.unserved_rps <= 1e-6 for w in result.workloads)
    assert not [w for w in result.warnings if w.startswith("window:")]


def test_a_max_min_fraction_plan_is_guarded_by_a_smaller_common_fraction():
    """A max_min_fraction plan gives flow up as a smaller phi: the guard lowers headroom on the same
    hardware, its LPs solve phi and then goodput with phi locked (step "window"), and no window warning
    is left. Before session 23 such plans kept the MILP's headroom with warnings, and gen-11's broke its
    p90 TBT class on seed 2 (docs/formulation.md, "The other objectives"). paper.json: the MILP's phi
    0.632 -> 0.625 under the guard (session 23)."""
    import msgspec

    from fleetplan import fixtures
    from fleetplan.models.codec import read_request

    request = read_request(fixtures.request_path("paper"))
    fair = msgspec.structs.replace(
        request, options=msgspec.structs.replace(request.options, objective="max_min_fraction")
    )
    result = plan(fair, with_baselines=False)
    assert not [w for w in result.warnings if w.startswith("window:")]
    window = [s for s in result.solver.stages if s.step == "window"]
    assert window
    assert window[0].stage == "phi"
    assert {s.stage for s in window} == {"phi", "goodput"}
    milp_phi = next(s.objective for s in result.solver.stages if s.step == "primary" and s.stage == "phi")
    fractions = [w.served_rps / (w.served_rps + w.unserved_rps) for w in result.workloads]
    guarded_phi = window[-2].objective  # the last round's phi stage
    assert guarded_phi <= milp_phi + 1e-9
    assert min(fractions) == pytest.approx(guarded_phi, rel=1e-6)
    assert result.objective_value == pytest.approx(guarded_phi, rel=1e-6)  # the plan's phi, not the MILP's
    instances = {(p.model, p.role, p.device, p.batch, p.group): p.instances for p in result.pools}
    assert all(p.utilization <= p.headroom + 1e-9 for p in result.pools)
    assert sum(instances.values()) > 0


def test_a_class_the_guard_leaves_no_route_drops_out_of_the_fairness_rows():
    """window._stranded: a class whose every carried route runs through a pool at 0 headroom (a colocated
    pool, or the prefill or the decode side of a split one) is stranded; one with a route left is not; a
    class that carried nothing is not counted."""
    import types

    import pandas as pd

    from fleetplan.solver.window import _stranded

    uses = pd.DataFrame(
        {
            "w": [0, 0, 1, 1, 1, 2, 2, 3],
            "role": [
                "colocated",
                "colocated",
                "prefill",
                "decode",
                "colocated",
                "prefill",
                "decode",
                "colocated",
            ],
            "pool": [0, 1, 2, 3, 4, 2, 5, 1],
        }
    )
    cand = types.SimpleNamespace(uses=uses, classes=pd.DataFrame(index=range(4)))
    carrying = np.array([True, True, True, True, False, True, True, False])
    rho = np.array([0.0, 0.5, 0.6, 0.0, 0.7, 0.4])
    # class 0: one colocated pool left; 1: its split route lost its decode (the colocated one carried
    # nothing); 2: prefill 0.6, decode 0.4; 3: carried nothing
    assert _stranded(cand, carrying, rho).tolist() == [False, True, False, False]


def test_a_min_cost_request_the_fleet_cannot_serve_gets_the_guarded_max_goodput_plan():
    """infeasible.json asks min_cost for more than its fleet serves, so plan() falls back to the
    max_goodput plan (status "infeasible"). That plan is settled (pooled credit, window guard) and
    extracted as the max_goodput plan it is: the same SLO RPS and pools as asking max_goodput outright,
    no window warning. Before, the fallback kept the MILP's headroom (114.90 SLO RPS, two warnings)."""
    import msgspec

    from fleetplan import fixtures
    from fleetplan.models.codec import read_request

    request = read_request(fixtures.request_path("infeasible"))
    assert request.options.objective == "min_cost"
    fallback = plan(request, with_baselines=False)
    goodput = msgspec.structs.replace(
        request, options=msgspec.structs.replace(request.options, objective="max_goodput")
    )
    direct = plan(goodput, with_baselines=False)
    assert fallback.status == "infeasible"
    assert {"pooled", "window"} & {s.step for s in fallback.solver.stages}
    assert fallback.slo_rps == pytest.approx(direct.slo_rps, rel=1e-9)
    assert {w.name: w.served_rps for w in fallback.workloads} == pytest.approx(
        {w.name: w.served_rps for w in direct.workloads}, rel=1e-9, abs=1e-9
    )

    def shape(result):
        return sorted((p.model, p.role, p.device, p.batch, p.instances, p.headroom) for p in result.pools)

    assert shape(fallback) == shape(direct)
    assert not [w for w in fallback.warnings if w.startswith("window:")]


@pytest.mark.parametrize("objective", ["max_goodput", "min_cost", "max_min_fraction"])
def test_a_solve_past_its_time_limit_still_returns_its_plan(objective):
    """optimize() may end after its time limit (its steps outside the solver run on), and the guard's
    rounds then have no time left. Before, the time left went into Options as 0 s, which Options refuses:
    a ValueError out of plan() (and a what-if point) for every request whose MILP used its whole limit
    (the M and L bench instances at 10 s). Now the rounds stop, and a min_cost request whose capped
    tables have no plan still gets its uncapped solve (at least window.MIN_ROUND_S). A search that found
    no plan in 0.01 s (a busy machine) is the planner's SolverFailure naming the time limit, never a
    ValueError."""
    import msgspec

    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.models.errors import SolverFailure
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.whatif.point import solve_request

    request = read_request(fixtures.request_path("paper"))
    options = msgspec.structs.replace(request.options, objective=objective, time_limit_s=0.01)
    request = msgspec.structs.replace(request, options=options)
    result, error = _or_failure(SolverFailure, lambda: plan(request, with_baselines=False))  # was ValueError
    if error is not None:
        assert error.field == "options.time_limit_s"
    else:
        assert result.solver.termination in ("optimal", "feasible")
        assert result.status in ("optimal", "feasible", "infeasible")
        assert result.slo_rps >= 0  # what the time allowed (an empty plan is feasible)
    cand = build_candidates(request, resolve_profiles(request))
    point, error = _or_failure(SolverFailure, lambda: solve_request(request, cand))
    if error is not None:
        assert error.field == "base.options.time_limit_s"
    else:
        assert point.status in ("optimal", "feasible", "infeasible")


def _or_failure(kind, call):
    """(call(), None), or (None, the error) when it raises `kind`."""
    try:
        return call(), None
    except kind as error:
        return None, error


def test_a_churn_limited_min_cost_replan_is_planned_on_the_guards_headroom():
    """A min_cost re-plan must serve all its demand like a first min_cost plan, so since session 24 it is
    solved on tables capped at the guard's headroom too (window.optimize_guarded), within its move limit.
    gen-25 (bench/fidelity.py) as min_cost, its demand at 0.8x, max_moves 4: before, 1 window warning at
    10.88 $/h; now none, at more cost, within 4 moves. gen-09 at 0.8x with max_moves 0: the capped tables
    need a move, so the plan in force stays, optimal, with its warning (not "infeasible": the move limit,
    not the promise, is what the capped model cannot meet)."""
    from bench.fidelity import generated, replanned, with_objective
    from fleetplan.replan.diff import diff

    request = with_objective(generated(25), "min_cost")
    first = plan(request, with_baselines=False)
    _, replan = replanned(request, (0.8, 4))
    assert replan.status == "optimal"
    assert not [w for w in replan.warnings if w.startswith("window:")]
    assert diff(first, replan).moves <= 4
    assert replan.slo_rps == pytest.approx(replan.demand_rps, rel=1e-6)

    request = with_objective(generated(9), "min_cost")
    first = plan(request, with_baselines=False)
    _, kept = replanned(request, (0.8, 0))
    assert kept.status == "optimal"
    assert diff(first, kept).moves == 0
    assert [w for w in kept.warnings if w.startswith("window:")]


def test_a_guard_round_whose_lp_stops_keeps_the_headroom_its_flows_were_solved_for(monkeypatch):
    """A later round of the guard whose LP stops without a plan (its time limit) leaves the plan of the
    round before with that round's headroom, not the lowered headroom with the old flows (which verify
    refused: a pool 'needs 0.597 instance-loads > 0.4 * 1')."""
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver import window

    request = read_request(fixtures.request_path("link_bound"))
    guarded_rho, solve_fixed = window._guarded_rho, window._solve_fixed
    calls = {"guard": 0, "solve": 0}

    def guard(cand, outcome, values, rho):
        calls["guard"] += 1
        lowered = guarded_rho(cand, outcome, values, rho)
        return rho * 0.5 if calls["guard"] == 2 and lowered is None else lowered  # a second round lowers

    def solve(*args):
        calls["solve"] += 1
        return None if calls["solve"] == 2 else solve_fixed(*args)  # and its LP stops without a plan

    monkeypatch.setattr(window, "_guarded_rho", guard)
    monkeypatch.setattr(window, "_solve_fixed", solve)
    result = plan(request, with_baselines=False)  # verify() inside: the plan holds at its headroom
    assert calls["solve"] == 2
    assert result.status in ("optimal", "feasible")


def test_a_guarded_plan_whose_guard_stopped_says_where_a_window_may_break(monkeypatch):
    """A max_goodput plan whose guard LP stops without a plan (its time limit) goes out at the MILP's
    headroom: it says so per pool, as an unguarded min_cost plan does, where before it said nothing.
    paper.json's plan, guarded as usual, carries no such warning; unguarded, two pools run above what the
    guard allows."""
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver import window

    request = read_request(fixtures.request_path("paper"))
    assert not [w for w in plan(request, with_baselines=False).warnings if w.startswith("window:")]
    monkeypatch.setattr(window, "_solve_fixed", lambda *args: None)
    stopped = [w for w in plan(request, with_baselines=False).warnings if w.startswith("window:")]
    assert stopped
    reason = "(the window guard stopped before it held: its four rounds ended, or its LP ran out of time)"
    assert all(w.endswith(reason) for w in stopped)


def test_a_max_goodput_plan_that_serves_everything_is_served_in_full_within_the_guard(monkeypatch):
    """Generated request 25 of bench/fidelity.py: its goodput LP serves every class, so the MILP is the one
    cost solve with every demand row an equality (optimize.fold_stages), and the guard would lower four of
    its pools. Its LP kept those equalities and found no plan, so the plan went out at the MILP's headroom
    with a warning per pool (session 32). The lexicographic optimum within the promise serves everything
    where the fleet can: the min_cost plan on the guard's headroom, at a little more cost."""
    from bench.fidelity import generated
    from fleetplan.solver import pipeline, window

    request = generated(25)
    result = plan(request, with_baselines=False)
    assert result.slo_rps == pytest.approx(result.demand_rps, rel=1e-7)
    assert not [w for w in result.warnings if w.startswith("window:")]
    primaries = [s.stage for s in result.solver.stages if s.step == "primary"]
    assert primaries == ["cost", "cost"]  # the folded solve, then the min_cost solve on the guard's headroom
    assert result.solver.tie_break.endswith("(served in full on the window guard's headroom)")
    assert result.objective == "max_goodput"
    assert all(p.utilization <= p.headroom + 1e-9 for p in result.pools)

    monkeypatch.setattr(pipeline, "settle", lambda r, c, o, d, **_: window.pool_credit(r, c, o, d))
    unguarded = plan(request, with_baselines=False)
    assert unguarded.slo_rps == pytest.approx(result.slo_rps, rel=1e-7)
    assert result.cost_per_hour > unguarded.cost_per_hour


def test_a_plan_that_serves_everything_gives_flow_up_where_it_cannot_be_served_in_full(monkeypatch):
    """The same request where the min_cost plan on the guard's headroom is not had (here: not tried): the
    guard's LP drops the fold's equalities and gives flow up on the same hardware, with no warning."""
    from bench.fidelity import generated
    from fleetplan.solver import window

    request = generated(25)
    monkeypatch.setattr(window, "in_full_guarded", lambda r, c, o, d=None: (c, o))
    result = plan(request, with_baselines=False)
    assert "window" in [s.step for s in result.solver.stages]
    assert not [w for w in result.warnings if w.startswith("window:")]
    assert result.slo_rps < result.demand_rps - 1e-6
    assert [s.stage for s in result.solver.stages if s.step == "primary"] == ["cost"]


def test_a_replan_whose_moves_keep_it_from_being_served_in_full_gives_flow_up():
    """A max_goodput re-plan of generated request 9 at 0.8 of its demand with max_moves 0 serves every
    class on the plan in force, but the guard would lower its pools and no plan on the guard's headroom
    keeps the moves: `optimize_guarded` leaves the plan in force, which the guard still lowers. That plan
    is not taken as one served in full on the guard's headroom (the review of session 33 found it was, its
    tie-break saying "cost: infeasible ... (served in full ...)"); the guard gives flow up instead."""
    from bench.fidelity import generated, replanned

    _, result = replanned(generated(9), (0.8, 0))
    assert "served in full" not in (result.solver.tie_break or "")
    assert not [w for w in result.warnings if w.startswith("window:")]
    assert "window" in [s.step for s in result.solver.stages]
    assert result.slo_rps < result.demand_rps - 1e-6
    assert all(p.utilization <= p.headroom + 1e-9 for p in result.pools)


def test_serving_in_full_is_not_tried_with_less_time_left_than_the_first_solve_took():
    """in_full_guarded under a deadline that leaves less than the first solve took returns its inputs at
    once: the re-solve (a second cost MIP, 3.6 s on generated request 25) would not end in time."""
    import time

    from bench.fidelity import generated
    from fleetplan.solver import window
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.deadline import Deadline

    request = generated(25)
    cand = build_candidates(request, resolve_profiles(request))
    outcome, _ = window.optimize_or_fall_back(request, cand)
    assert window._in_full(request, cand, outcome)  # served in full, and the guard would lower it
    began = time.perf_counter()
    kept_cand, kept = window.in_full_guarded(request, cand, outcome, Deadline.after(1.0))
    assert (kept_cand, kept) == (cand, outcome)
    assert time.perf_counter() - began < 0.5
    served_cand, served = window.in_full_guarded(request, cand, outcome)  # no deadline: 20 s
    assert served is not outcome
    assert served.tie_break.endswith("(served in full on the window guard's headroom)")
    assert served.build_ms == outcome.build_ms
    assert served.solve_ms > outcome.solve_ms


def test_a_max_min_fraction_plan_that_serves_everything_is_served_in_full_within_the_guard():
    """Generated request 25 as max_min_fraction: its MILP (phi 1, folded) is guarded like the max_goodput
    one: served in full on the guard's headroom, phi 1 reported. Before, its guard gave flow up (43.15 of
    44.03 RPS) while the plan still reported the MILP's phi of 1."""
    from bench.fidelity import generated, with_objective

    result = plan(with_objective(generated(25), "max_min_fraction"), with_baselines=False)
    assert result.objective == "max_min_fraction"
    assert result.slo_rps == pytest.approx(result.demand_rps, rel=1e-7)
    assert result.objective_value == pytest.approx(1.0, rel=1e-7)
    assert result.solver.tie_break.endswith("(served in full on the window guard's headroom)")
    assert not [w for w in result.warnings if w.startswith("window:")]


def _acme(ttft_chat_ms: float, with_chat: bool = True):
    """A two-device fleet of a custom model on inline rows (a new user's request, session 34): `chat`
    at TTFT `ttft_chat_ms` p90 and `summarize` (p99), whose pools the window guard lowers."""
    from fleetplan.models.codec import convert
    from fleetplan.models.plan import PlanRequest

    rows = []
    for device, prefill, decode in (("h100", 0.05, 9.0), ("acc-x", 0.16, 14.0)):
        for tp in (1, 2):
            for batch in (1, 4, 8):
                for prompt in (256, 1024, 2048):
                    ttft = (5 + prefill * batch * prompt) / (tp * 0.9)
                    tbt = decode / (tp * 0.85) * (1 + 0.04 * batch) + 0.0005 * batch * prompt / 1000
                    quantiles = {
                        f"{k}_ms_p{p}": v * f
                        for k, v in (("ttft", ttft), ("tbt", tbt))
                        for p, f in ((50, 1.0), (90, 1.07), (99, 1.15))
                    }
                    rows.append(
                        {
                            "model": "acme-8b",
                            "device": device,
                            "tp": tp,
                            "batch": batch,
                            "prompt_tokens": prompt,
                            **quantiles,
                        }
                    )
    chat = {
        "name": "chat",
        "model": "acme-8b",
        "prompt_tokens": 512,
        "output_tokens": 256,
        "rate_rps": 12,
        "slo": {"ttft_ms": ttft_chat_ms, "tbt_ms": 40, "percentile": 90},
    }
    summarize = {
        "name": "summarize",
        "model": "acme-8b",
        "prompt_tokens": 1800,
        "output_tokens": 128,
        "rate_rps": 4,
        "slo": {"ttft_ms": 1500, "tbt_ms": 60, "percentile": 99},
    }
    request = {
        "devices": [
            {
                "name": "h100",
                "count": 2,
                "kind": "gpu",
                "memory_gib": 80,
                "network_gbps": 100,
                "cost_per_hour": 4.0,
            },
            {
                "name": "acc-x",
                "count": 6,
                "kind": "other",
                "memory_gib": 32,
                "network_gbps": 25,
                "cost_per_hour": 1.2,
            },
        ],
        "links": [
            {"source": "h100", "target": "acc-x", "gbps": 10},
            {"source": "acc-x", "target": "h100", "gbps": 10},
        ],
        "models": [{"name": "acme-8b", "layers": 32, "kv_heads": 8, "head_dim": 128}],
        "workloads": [chat, summarize] if with_chat else [summarize],
        "profiles": {"rows": rows},
        "options": {"time_limit_s": 20},
    }
    return convert(request, PlanRequest)


def test_a_class_no_pool_serves_does_not_keep_the_others_from_being_served_in_full():
    """Found by a new user's request (session 34): `chat` at a TTFT no device meets (5 ms) has no candidate
    pool. The MILP served `summarize` in full, but serving in full on the guard's headroom asked for every
    class in full, `chat` included, so it was not tried: the guard gave 0.26 of summarize's 4 RPS up on
    the same hardware while both H100 stood idle, and the plan fell below the GPU-only baseline. What any
    plan can serve of a class with no pool is nothing (formulation.servable_demand): the plan serves
    `summarize` in full, as the same request without `chat` does, at the same cost."""
    with_chat = plan(_acme(5.0), with_baselines=False)
    alone = plan(_acme(5.0, with_chat=False), with_baselines=False)
    served = {w.name: w.served_rps for w in with_chat.workloads}
    assert served == {"chat": 0.0, "summarize": pytest.approx(4.0, rel=1e-7)}
    assert alone.slo_rps == pytest.approx(4.0, rel=1e-7)
    assert with_chat.cost_per_hour == pytest.approx(alone.cost_per_hour, rel=1e-9)
    assert with_chat.solver.tie_break.endswith("(served in full on the window guard's headroom)")
    assert "no device meets TTFT 5 ms" in next(w.reason for w in with_chat.workloads if w.name == "chat")
