"""What-if sweeps and purchasable devices on tiny inline-profile requests, checked by hand and against
single plans (fleetplan.solver.plan, the function behind POST /plan)."""

import json
import random
import re
import xml.etree.ElementTree as ET

import click
import msgspec
import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from fleetplan import fixtures
from fleetplan.api.app import create_app
from fleetplan.api.cli import main
from fleetplan.models.codec import encode, read_request, to_builtins
from fleetplan.models.plan import PlanRequest
from fleetplan.models.whatif import Axis, WhatIfRequest
from fleetplan.solver import plan
from fleetplan.whatif import run_whatif, to_csv
from fleetplan.whatif.executors import DaskCluster, LocalProcesses
from fleetplan.whatif.frontier import frontier
from fleetplan.whatif.grid import variant

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def flat_rows(latency_ms: dict[str, float]) -> list[dict]:
    """One batch-1 row per device at prompts 64 and 256 with TTFT = TBT = latency_ms at every percentile."""
    rows = []
    for device, ms in latency_ms.items():
        for prompt in (64, 256):
            row = {"model": "llama-3.2-1b", "device": device, "tp": 1, "batch": 1, "prompt_tokens": prompt}
            for q in (50, 90, 99):
                row[f"ttft_ms_p{q}"] = ms
                row[f"tbt_ms_p{q}"] = ms
            rows.append(row)
    return rows


def two_types(small: dict | None = None, big: dict | None = None, budget: float | None = None) -> PlanRequest:
    """One class of 40 RPS, 2 output tokens, colocated only, flat headroom 0.8.

    Colocated rate per instance: rC = b / (TTFT + (o - 1) TBT) = 1 / (2 * latency): small (100 ms) 5 RPS,
    big (50 ms) 10 RPS; admissible at 0.8: small 4 RPS for 1 $/h, big 8 RPS for 3 $/h.
    """
    body = {
        "devices": [
            {"name": "small", "count": 2, "cost_per_hour": 1.0, **(small or {})},
            {"name": "big", "count": 0, "cost_per_hour": 3.0, **(big or {})},
        ],
        "workloads": [
            {
                "name": "w",
                "model": "llama-3.2-1b",
                "prompt_tokens": 128,
                "output_tokens": 2,
                "rate_rps": 40,
                "slo": {"ttft_ms": 1000, "tbt_ms": 1000},
            }
        ],
        "profiles": {"rows": flat_rows({"small": 100.0, "big": 50.0})},
        "options": {
            "capacity_model": "flat",
            "max_utilization": 0.8,
            "allow_disaggregated": False,
            "mip_rel_gap": 1e-9,
            "budget_per_hour": budget,
        },
    }
    return msgspec.convert(body, PlanRequest)


def whatif(base: PlanRequest, *axes: dict, **flags) -> WhatIfRequest:
    return WhatIfRequest(base=base, axes=[msgspec.convert(a, Axis) for a in axes], **flags)


# --- purchasable devices and marginal values, by hand ----------------------------------------------------


def test_purchasable_devices_buy_the_hand_computed_mix():
    """Budget 7.5 $/h, small 2 owned (up to 4), big 0 owned (up to 3): s + 3g <= 7.5 with s <= 4 maximizes
    4s + 8g at s = 4, g = 1 (24 RPS, 7 $/h; s = 2, g = 2 would cost 8): buy 2 small and 1 big."""
    request = two_types(small={"max_count": 4}, big={"max_count": 3}, budget=7.5)
    result = plan(request)  # verified inside plan()
    assert result.slo_rps == pytest.approx(24.0, rel=1e-6)
    assert result.cost_per_hour == pytest.approx(7.0)
    devices = {d.name: (d.used, d.available, d.bought) for d in result.devices}
    assert devices == {"small": (4, 2, 2), "big": (1, 0, 1)}
    # without max_count the fleet is the 2 owned small devices: 2 * 4 RPS
    assert plan(two_types(budget=7.5)).slo_rps == pytest.approx(8.0, rel=1e-6)


def test_max_count_below_count_is_refused_naming_the_field():
    with pytest.raises(msgspec.ValidationError, match="max_count"):
        two_types(small={"max_count": 1})


def test_marginal_value_of_one_more_device_by_hand():
    """2 small + 1 big serve 4 + 4 + 8 = 16 of 40 RPS: one more small adds 4 RPS, one more big 8. Under
    a 5 $/h budget (what they cost) one more device of either type adds nothing, and the budget binds."""
    base = two_types(big={"count": 1})
    result = run_whatif(whatif(base, {"param": "budget_per_hour", "values": [5.0]}, baselines=False))
    free = run_whatif(whatif(base, {"param": "demand_scale", "values": [1.0]}, baselines=False))
    (point,) = free.points
    assert point.slo_rps == pytest.approx(16.0, rel=1e-6)
    assert point.marginal_rps == pytest.approx({"small": 4.0, "big": 8.0}, rel=1e-6)
    assert set(point.binding) == {"devices:small", "devices:big"}
    (capped,) = result.points
    assert capped.slo_rps == pytest.approx(16.0, rel=1e-6)
    assert capped.marginal_rps == {"small": 0.0, "big": 0.0}
    assert "budget" in capped.binding


def test_marginal_values_equal_single_plans_with_one_more_device():
    """Each marginal value is plan(point's request with one more device) - plan(point's request), whether
    the LP relaxation of the plans that use the extra device settles it (screened), a MIP over those
    plans finds one that beats the point, or none does. Purchasable types: max_count rises too."""
    from fleetplan.whatif.grid import one_more

    base = two_types(small={"max_count": 3}, big={"max_count": 1})
    budgets = [0.5, 2.0, 3.5, 5.0, 6.0, 7.0, 20.0]
    request = whatif(base, {"param": "budget_per_hour", "values": budgets}, baselines=False)
    result = run_whatif(request)
    assert result.solver.screened > 0
    for point in result.points:
        at = variant(base, point.coords)
        own = plan(at, with_baselines=False).slo_rps
        for device in at.devices:
            more = plan(one_more(at, device.name), with_baselines=False).slo_rps
            expected = more - own if more - own > 1e-6 else 0.0
            value = point.marginal_rps[device.name]
            assert value == pytest.approx(expected, abs=1e-6), (point.coords, device.name)


def test_a_plan_answers_the_lower_device_counts_it_fits():
    """5 $/h, one big device (8 RPS for 3 $/h), 0-8 small ones (4 RPS for 1 $/h each): by hand 8, 12, 16,
    16, 16 RPS for 0-4 small devices, then 20 (five small, no big) from 5 up. Falling counts: the plan at 8
    uses 5 small devices, so it is the plan at 5, 6 and 7 too, and the plan at 3 (two small and the big
    one) the plan at 2: 4 of 9 points reused, 5 solves. Each point equals a single plan. A device type is
    binding only where the point's own count leaves no room: a reused plan keeps its devices, not the
    count it was solved under, with or without marginal values."""
    base = two_types(big={"count": 1}, budget=5.0)
    axis = {"param": "count:small", "start": 0, "stop": 8, "num": 9}
    result = run_whatif(whatif(base, axis, baselines=False, marginal=False))
    assert [p.slo_rps for p in result.points] == pytest.approx([8, 12, 16, 16, 16, 20, 20, 20, 20], rel=1e-6)
    assert (result.solver.solves, result.solver.reused) == (5, 4)
    for point in result.points:
        single = plan(variant(base, point.coords), with_baselines=False)
        assert point.slo_rps == pytest.approx(single.slo_rps, rel=1e-6)
        assert point.cost_per_hour == pytest.approx(single.cost_per_hour)
        assert point.devices == {d.name: d.used for d in single.devices}
        full = point.devices["small"] == point.coords["count:small"]
        assert ("devices:small" in point.binding) == full, point.coords
    # with marginal values, each point's plan with one more small device is the next point's plan (the
    # same request): kept for it, with the binding limits of the point it was solved for, until they were
    # computed per point
    marginal = run_whatif(whatif(base, axis, baselines=False))
    for point, plain in zip(marginal.points, result.points, strict=True):
        assert point.devices == plain.devices
        assert point.binding == plain.binding, point.coords


def test_marginal_values_agree_across_backends():
    """The same sweep through Pyomo (HiGHS underneath, the cutoff passed as one of its options) gives the
    same marginal values as the highs backend."""
    import importlib.util

    if importlib.util.find_spec("pyomo") is None:
        pytest.skip("pyomo not installed: pip install 'fleetplan[pyomo]'")
    base = two_types(small={"max_count": 3}, big={"max_count": 1})
    axis = {"param": "budget_per_hour", "values": [2.0, 5.0, 20.0]}
    reference = run_whatif(whatif(base, axis, baselines=False))
    options = msgspec.structs.replace(base.options, solver="pyomo")
    other = run_whatif(whatif(msgspec.structs.replace(base, options=options), axis, baselines=False))
    for mine, theirs in zip(other.points, reference.points, strict=True):
        assert mine.slo_rps == pytest.approx(theirs.slo_rps, abs=1e-6)
        assert mine.marginal_rps == pytest.approx(theirs.marginal_rps, abs=1e-6)
    assert any(v > 0 for p in reference.points for v in p.marginal_rps.values())


def test_optimize_above_solves_the_plans_that_use_one_more_device_or_says_none_beats():
    """Without a budget one more big device (8 RPS) is worth having, and optimize_above finds the same
    optimum as optimize() on the request with it; under a 5 $/h budget (what the fleet costs) nothing that
    uses it beats the point (LP settled), nor does any plan beat a floor above that optimum; objectives that
    do not maximize first are refused."""
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.optimize import optimize, optimize_above
    from fleetplan.solver.pipeline import resolve_profiles
    from fleetplan.whatif.grid import one_more

    def prepare(request: PlanRequest):
        return build_candidates(request, resolve_profiles(request))

    base = two_types(big={"count": 1})
    more = one_more(base, "big")
    best = optimize(more, prepare(more))
    above, mip = optimize_above(more, prepare(more), 16.0 * (1 + 1e-9), ("big", 1))
    assert above is not None
    assert mip
    assert above.primary_value == pytest.approx(best.primary_value, rel=1e-9) == pytest.approx(24.0)
    assert optimize_above(more, prepare(more), 24.5, ("big", 1)) == (None, False)  # the LP says 24
    capped = one_more(two_types(big={"count": 1}, budget=5.0), "big")
    assert optimize_above(capped, prepare(capped), 16.0 * (1 + 1e-9), ("big", 1))[0] is None
    options = msgspec.structs.replace(more.options, objective="min_cost")
    cost_first = msgspec.structs.replace(more, options=options)
    with pytest.raises(ValueError, match="maximized first stage"):
        optimize_above(cost_first, prepare(cost_first), 0.0, ("big", 1))


def test_optimize_above_runs_no_cost_tie_break_when_nothing_beats_the_floor(monkeypatch):
    """On paper.json at 19.39 $/h, one more Inferentia2 device: its LP relaxation is above the point's
    value, but no plan that uses the extra device beats it. optimize_above says so (None, after a MIP) and
    never runs the cost tie-break (HiGHS keeps the sub-MIP's plan below its cutoff as its incumbent; the
    tie-break of that plan cost up to 0.6 s a time in a budget sweep)."""
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver import optimize as optimize_module
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.pipeline import resolve_profiles
    from fleetplan.whatif.grid import one_more

    base = read_request(fixtures.request_path("paper"))
    options = msgspec.structs.replace(base.options, budget_per_hour=60.0 * 32 / 99)
    point = msgspec.structs.replace(base, options=options)
    more = one_more(point, "inf2")
    value = optimize_module.optimize(point, build_candidates(point, resolve_profiles(point))).primary_value
    floor = value * (1 + options.mip_rel_gap)
    cand = build_candidates(more, resolve_profiles(more))
    runs = []
    monkeypatch.setattr(optimize_module, "tie_break", lambda *a: runs.append(a) or pytest.fail("tie-break"))
    # True: the LP relaxation did not settle it, the MIP with the cutoff ran
    assert optimize_module.optimize_above(more, cand, floor, ("inf2", 8)) == (None, True)
    assert runs == []


# --- sweeps against single plans -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def budget_sweep():
    base = two_types(small={"max_count": 4}, big={"max_count": 3})
    request = whatif(base, {"param": "budget_per_hour", "start": 0, "stop": 14, "num": 15})
    return request, run_whatif(request)


def test_more_budget_never_less_slo_rps(budget_sweep):
    request, result = budget_sweep
    gap = request.base.options.mip_rel_gap
    rps = [p.slo_rps for p in result.points]
    budgets = [p.coords["budget_per_hour"] for p in result.points]
    assert budgets == sorted(budgets)
    for low, high in zip(rps, rps[1:], strict=False):
        assert high >= low * (1 - gap) - 1e-9
    # hand values: 4 RPS per $ on small up to 4 devices, then 8 RPS per 3 $ on big
    assert rps[4] == pytest.approx(16.0, rel=1e-6)
    assert rps[7] == pytest.approx(24.0, rel=1e-6)
    assert result.solver.reused > 0  # points above the cheapest full plan reuse it


def test_three_random_points_equal_single_plans(budget_sweep):
    request, result = budget_sweep
    gap = max(request.base.options.mip_rel_gap, 1e-6)
    for index in random.Random(11).sample(range(len(result.points)), 3):
        point = result.points[index]
        single = plan(variant(request.base, point.coords))
        assert point.status == single.status
        assert point.slo_rps == pytest.approx(single.slo_rps, rel=gap, abs=1e-6)
        assert point.cost_per_hour == pytest.approx(single.cost_per_hour, rel=gap, abs=1e-6)
        assert point.devices == {d.name: d.used for d in single.devices}
        assert point.bought == {d.name: d.bought for d in single.devices}
        assert point.baselines is not None
        assert single.baselines is not None
        assert point.baselines.greedy.slo_rps == pytest.approx(single.baselines.greedy.slo_rps, abs=1e-6)
        assert point.baselines.gpu_only.slo_rps == pytest.approx(single.baselines.gpu_only.slo_rps, abs=1e-6)


def test_budgets_from_the_fleet_cost_up_take_one_solve_and_a_plateau_another():
    """Fleet cost 4 small x 1 + 1 big x 3 = 7 $/h: the budgets 7, 9 and 12 constrain nothing, so one solve
    answers all three. 6.5 $/h buys 3 small + 1 big (20 RPS for 6 $/h), which is also the plan at 6: in
    falling order that plateau is one solve. Every point is still its own single plan."""
    base = two_types(small={"max_count": 4}, big={"max_count": 1})
    budgets = [0, 2, 4, 6, 6.5, 7, 9, 12]
    request = whatif(base, {"param": "budget_per_hour", "values": budgets}, marginal=False, baselines=False)
    result = run_whatif(request)
    assert result.solver.solves == 5  # 12 (for 7, 9, 12), 6.5 (for 6 and 6.5), 4, 2, 0
    assert result.solver.reused == 3
    assert [p.reused for p in result.points] == [False, False, False, True, False, True, True, False]
    assert [p.slo_rps for p in result.points] == pytest.approx([0, 8, 16, 20, 20, 24, 24, 24], abs=1e-6)
    for point in result.points:
        single = plan(variant(base, point.coords), with_baselines=False)
        assert point.slo_rps == pytest.approx(single.slo_rps, abs=1e-6)
        assert point.cost_per_hour == pytest.approx(single.cost_per_hour, abs=1e-6)
        assert point.devices == {d.name: d.used for d in single.devices}


def test_a_plan_cheaper_after_the_pooled_credit_answers_no_lower_budget():
    """The fidelity benchmark's generated request 14 at 10.75 $/h: the MILP's plan spends 10.0 $/h, and the
    pooled credit leaves instances without load, so the plan reports 9.0 $/h. At 9.5 $/h (between the two)
    that plan is not provably the MILP's: the point solves its own, equal to a single plan. (The case moves
    with the capacity model: a budget sweep of the bundled requests has none since session 18, so the test
    takes a generated one.)"""
    from bench.fidelity import generated

    base = generated(14)
    budgets = [9.5, 10.75]
    request = whatif(base, {"param": "budget_per_hour", "values": budgets}, marginal=False, baselines=False)
    result = run_whatif(request)
    assert result.solver.solves == 2
    assert result.solver.reused == 0
    assert result.points[1].cost_per_hour < budgets[0]  # the case under test: reported below the lower budget
    gap = base.options.mip_rel_gap
    for point in result.points:
        single = plan(variant(base, point.coords), with_baselines=False)
        assert point.slo_rps == pytest.approx(single.slo_rps, rel=gap)
        assert point.cost_per_hour == pytest.approx(single.cost_per_hour, rel=gap)


def test_baselines_are_reused_along_the_budget_and_equal_single_plans(monkeypatch):
    """Each baseline computed under a budget B that spends C answers every budget in [C, B] (and from the
    fleet's cost, 22.25 $/h, up every budget): fewer runs than points, and every point's baselines equal
    those of a single plan at that budget."""
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.solver import baselines
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.pipeline import resolve_profiles

    base = read_request(fixtures.request_path("paper"))
    budgets = [0.5, 4.0, 4.5, 9.0, 16.0, 23.0, 30.0, 60.0]
    calls = {"gpu_only": 0, "greedy": 0}
    gpu_only_run, greedy_run = baselines.gpu_only_run, baselines.greedy_run

    def counted(name, run):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return run(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(baselines, "gpu_only_run", counted("gpu_only", gpu_only_run))
    monkeypatch.setattr(baselines, "greedy_run", counted("greedy", greedy_run))
    request = whatif(base, {"param": "budget_per_hour", "values": budgets}, marginal=False)
    result = run_whatif(request)
    # 60, 30 and 23 $/h are above the fleet's cost: one run answers all three. GPU-only (A6000 at 1 $/h,
    # 4 of them) spends 4 $/h from 4 $/h up, so the run at 16 also answers 9, 4.5 and 4; 0.5 is its own
    assert calls["gpu_only"] == 3
    assert calls["greedy"] <= len(budgets) - 2
    monkeypatch.undo()
    for point in result.points:
        single = variant(base, point.coords)
        cand = build_candidates(single, resolve_profiles(single))
        assert point.baselines is not None
        gpu = baselines.gpu_only(cand, single.options.time_limit_s)
        assert point.baselines.gpu_only.slo_rps == pytest.approx(gpu.slo_rps, rel=1e-6, abs=1e-6)
        assert point.baselines.greedy.slo_rps == pytest.approx(baselines.greedy(cand).slo_rps, abs=1e-6)
        assert point.baselines.greedy.cost_per_hour <= point.coords["budget_per_hour"] + 1e-9


def test_a_point_is_solved_as_a_single_plan_not_from_its_neighbours_plan():
    """paper.json at 16.97 $/h has several MILP plans of one value (52.509), which the window guard lowers
    differently: the one HiGHS finds cold (a single POST /plan) serves 52.208 SLO RPS, the one it found
    when the sweep handed it the plan of 17.58 $/h (the point above) 52.499. A point the sweep solves is
    solved as a single plan is, so it is that plan itself."""
    base = read_request(fixtures.request_path("paper"))
    budgets = [16.96969696969697, 17.575757575757578]
    request = whatif(base, {"param": "budget_per_hour", "values": budgets}, marginal=False, baselines=False)
    result = run_whatif(request)
    assert result.solver.solves == 2
    for point in result.points:
        single = plan(variant(base, point.coords), with_baselines=False)
        assert point.slo_rps == single.slo_rps
        assert point.cost_per_hour == single.cost_per_hour
        assert point.devices == {d.name: d.used for d in single.devices}


def test_a_min_cost_point_the_fleet_cannot_serve_equals_its_single_plan():
    """infeasible.json (min_cost, more demand than its fleet serves): each point falls back to the
    max_goodput plan, settled as plan() settles it (the pooled credit and the window guard)."""
    base = read_request(fixtures.request_path("infeasible"))
    request = whatif(base, {"param": "demand_scale", "values": [0.9, 1.0]}, marginal=False, baselines=False)
    result = run_whatif(request)
    for point in result.points:
        single = plan(variant(base, point.coords), with_baselines=False)
        assert point.status == single.status == "infeasible"
        assert point.slo_rps == pytest.approx(single.slo_rps, rel=1e-9)
        assert point.cost_per_hour == pytest.approx(single.cost_per_hour, abs=1e-9)


def test_count_and_price_grid_points_equal_single_plans():
    """Shared candidates with per-point device rows and prices: each point as its own plan."""
    base = two_types(big={"count": 1}, budget=6.0)
    request = whatif(
        base,
        {"param": "count:small", "values": [0, 1, 3]},
        {"param": "price:big", "values": [1.0, 5.0]},
        marginal=False,
        baselines=False,
    )
    result = run_whatif(request)
    assert [p.coords for p in result.points][:2] == [
        {"count:small": 0.0, "price:big": 1.0},
        {"count:small": 0.0, "price:big": 5.0},
    ]
    for point in result.points:
        single = plan(variant(base, point.coords))
        assert point.slo_rps == pytest.approx(single.slo_rps, abs=1e-6)
        assert point.cost_per_hour == pytest.approx(single.cost_per_hour, abs=1e-6)
    # big at 5 $/h does not fit a 6 $/h budget beside 1 small... 1 big (5) + 1 small (1) = 6: 8 + 4 RPS
    assert result.points[3].slo_rps == pytest.approx(12.0, rel=1e-6)


def test_a_count_by_max_count_grid_with_marginal_values_equals_single_plans():
    """0-5 owned small devices (up to 5 in all: the rest bought) by 0-2 purchasable big ones under 7.5 $/h.
    Owning or buying a device changes only what the plan reports as bought, so the small axis shares one
    model and the plans are reused across it (4 solves for 18 points and their marginal values); every
    point, its bought devices and its marginal values are those of single plans."""
    from fleetplan.whatif.grid import one_more

    base = two_types(small={"max_count": 5}, budget=7.5)
    request = whatif(
        base,
        {"param": "count:small", "values": [0, 1, 2, 3, 4, 5]},
        {"param": "max_count:big", "values": [0, 1, 2]},
        baselines=False,
    )
    result = run_whatif(request)
    assert result.solver.solves < len(result.points)
    for point in result.points:
        at = variant(base, point.coords)
        single = plan(at, with_baselines=False)
        assert point.slo_rps == pytest.approx(single.slo_rps, abs=1e-6), point.coords
        assert point.cost_per_hour == pytest.approx(single.cost_per_hour, abs=1e-6), point.coords
        assert point.devices == {d.name: d.used for d in single.devices}, point.coords
        assert point.bought == {d.name: d.bought for d in single.devices}, point.coords
        for device in at.devices:
            more = plan(one_more(at, device.name), with_baselines=False).slo_rps
            expected = more - single.slo_rps if more - single.slo_rps > 1e-6 else 0.0
            value = point.marginal_rps[device.name]
            assert value == pytest.approx(expected, abs=1e-6), (point.coords, device.name)


def test_a_count_that_fits_other_pools_plans_on_its_own_candidate_tables():
    """paper.json with 0 and 1 Inferentia2 devices: at 0 no inf2 pool fits, so no prefill use is sized
    for a transfer into inf2's 8 Gbit/s NICs, and at 1 its tp-2 pools do not fit. The sweep's shared
    tables (built for the most devices any point may use) held both, and the point at 0 showed 46.76 SLO
    RPS where a single plan gives 48.77. Each point and each marginal value (one more device can fit new
    pools: then both plans are solved) now equals single plans."""
    from fleetplan import fixtures
    from fleetplan.models.codec import read_request
    from fleetplan.whatif.grid import one_more

    base = read_request(fixtures.request_path("paper"))
    result = run_whatif(whatif(base, {"param": "count:inf2", "values": [0, 1]}, baselines=False))
    assert result.solver.candidates_built >= 2  # the shared tables and at least one point's own
    for point in result.points:
        at = variant(base, point.coords)
        single = plan(at, with_baselines=False).slo_rps
        assert point.slo_rps == pytest.approx(single, rel=1e-6), point.coords
        for device in at.devices:
            more = plan(one_more(at, device.name), with_baselines=False).slo_rps
            expected = more - single if more - single > 1e-6 else 0.0
            value = point.marginal_rps[device.name]
            assert value == pytest.approx(expected, abs=1e-6), (point.coords, device.name)


def test_more_demand_never_more_unserved_capacity():
    """demand_scale rebuilds candidates per point: served RPS never falls as demand grows, and the unused
    capacity (what the plan could still serve) never grows."""
    base = two_types(big={"count": 1})
    result = run_whatif(
        whatif(base, {"param": "demand_scale", "values": [0.1, 0.25, 0.5, 1.0]}, baselines=False)
    )
    assert result.solver.candidates_built == 4
    served = [p.slo_rps for p in result.points]
    capacity = 2 * 4 + 8  # every device busy: 16 RPS
    spare = [capacity - s for s in served]
    assert served == pytest.approx([4.0, 10.0, 16.0, 16.0], rel=1e-6)
    assert all(b <= a + 1e-9 for a, b in zip(spare, spare[1:], strict=False))


def test_frontier_is_the_non_dominated_points(budget_sweep):
    _, result = budget_sweep
    on = set(result.frontier)
    pts = result.points
    for i, p in enumerate(pts):
        beaten = any(
            q.cost_per_hour <= p.cost_per_hour
            and q.slo_rps >= p.slo_rps
            and (q.cost_per_hour < p.cost_per_hour - 1e-6 or q.slo_rps > p.slo_rps + 1e-6)
            for q in pts
        )
        assert (i in on) == (not beaten)
    made = msgspec.structs.replace(pts[3], cost_per_hour=pts[-1].cost_per_hour + 1, slo_rps=0.5)
    assert 0 not in frontier([made, pts[3]])


# --- executors -----------------------------------------------------------------------------------------


def _summary(result):
    return [(p.coords, round(p.slo_rps, 6), round(p.cost_per_hour, 6), p.devices) for p in result.points]


def test_local_processes_and_dask_give_the_serial_answer():
    distributed = pytest.importorskip("distributed")
    base = two_types(small={"max_count": 3}, big={"max_count": 1})
    request = whatif(base, {"param": "budget_per_hour", "values": [0, 4, 8]}, baselines=False)
    serial = run_whatif(request)
    parallel = run_whatif(request, LocalProcesses(2))
    assert parallel.solver.executor == "processes"
    assert _summary(parallel) == _summary(serial)
    with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=False,
            protocol="tcp://",
            host="127.0.0.1",
            scheduler_port=0,
            dashboard_address=None,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        seen = []
        on_dask = run_whatif(request, DaskCluster(client=client), progress=lambda d, t: seen.append((d, t)))
        by_address = run_whatif(request, DaskCluster(address=cluster.scheduler_address))  # --scheduler
    assert on_dask.solver.executor == "dask"
    assert _summary(on_dask) == _summary(serial)
    assert _summary(by_address) == _summary(serial)
    assert by_address.solver.workers == 2  # threads of the one worker
    assert seen[0] == (0, 3)
    assert seen[-1] == (3, 3)


# --- outputs: CSV, plots, HTTP, CLI --------------------------------------------------------------------


def _body() -> dict:
    base = to_builtins(two_types(small={"max_count": 3}, big={"max_count": 1}))
    return {
        "base": base,
        "axes": [
            {"param": "budget_per_hour", "values": [2, 5]},
            {"param": "demand_scale", "values": [0.5, 1]},
        ],
        "marginal": False,
    }


def _post(client, body, accept="application/json", query=""):
    headers = {"content-type": "application/json", "accept": accept}
    return client.post(f"/whatif{query}", content=json.dumps(body), headers=headers)


def test_http_json_csv_and_pictures():
    with TestClient(app=create_app()) as client:
        answer = _post(client, _body())
        assert answer.status_code == 200
        data = answer.json()
        assert len(data["points"]) == 4
        assert data["axes"] == ["budget_per_hour", "demand_scale"]
        single = plan(
            variant(two_types(small={"max_count": 3}, big={"max_count": 1}), data["points"][3]["coords"])
        )
        assert data["points"][3]["slo_rps"] == pytest.approx(single.slo_rps, abs=1e-6)
        lean = {**_body(), "baselines": False}
        table = _post(client, lean, accept="text/csv")
        assert table.headers["content-type"].startswith("text/csv")
        lines = table.text.strip().splitlines()
        assert len(lines) == 5
        assert lines[0].startswith("budget_per_hour,demand_scale,status,slo_rps")
        # q-values decide (the first draft answered SVG whenever Accept named it at all)
        png = _post(client, lean, accept="image/png;q=1, image/svg+xml;q=0.1", query="?plot=frontier")
        assert png.headers["content-type"] == "image/png"
        assert png.content.startswith(PNG_MAGIC)
        svg = _post(client, lean, accept="image/svg+xml", query="?plot=heatmap")
        assert ET.fromstring(svg.content).tag.endswith("svg")
        # sweeps hold solve slots: counted like plans, by kind (they were not counted at all)
        assert 'fleetplan_solves_total{kind="whatif",outcome="plan"} 4.0' in client.get("/metrics").text


@pytest.mark.parametrize(
    ("change", "query", "field", "says"),
    [
        ({"axes": [{"param": "speed", "values": [1]}]}, "", "axes[0].param", "is not one of"),
        ({"axes": [{"param": "count:gpu", "values": [1]}]}, "", "axes[0].param", "unknown device 'gpu'"),
        ({"axes": [{"param": "budget_per_hour", "start": 0, "num": 3}]}, "", "axes[0].values", "start, stop"),
        ({"axes": [{"param": "budget_per_hour", "values": [1]}]}, "?plot=heatmap", "plot", "two axes"),
        ({}, "?plot=pie", "plot", "unknown plot"),
    ],
)
def test_http_bad_input_is_a_problem_naming_the_field(change, query, field, says):
    body = {**_body(), **change}
    with TestClient(app=create_app()) as client:
        answer = _post(client, body, query=query)
    assert answer.status_code == 400
    problem = answer.json()
    assert problem["field"] == field
    assert says in problem["detail"]


def test_http_an_accept_no_form_answers_is_a_406_before_any_solve():
    with TestClient(app=create_app()) as client:
        answer = _post(client, _body(), accept="application/json", query="?plot=frontier")
        assert answer.status_code == 406
        assert answer.headers["content-type"].startswith("application/problem+json")
        problem = answer.json()
        assert problem["field"] == "accept"
        assert problem["type"] == "urn:fleetplan:problem:not-acceptable"
        assert "image/svg+xml or image/png" in problem["detail"]
        assert 'fleetplan_solves_total{kind="whatif"' not in client.get("/metrics").text  # refused up front


def test_cli_writes_csv_and_plots(tmp_path):
    request = tmp_path / "tiny.json"
    request.write_bytes(encode(two_types(small={"max_count": 3}, big={"max_count": 1})))
    out = tmp_path / "points.csv"
    runner = CliRunner()
    args = ["whatif", str(request), "--axis", "budget_per_hour=0:6:3", "--axis", "demand_scale=0.5,1"]
    args += [
        "--workers",
        "1",
        "--no-progress",
        "--no-marginal",
        "--csv",
        str(out),
        "--plot",
        str(tmp_path / "p"),
    ]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "Pareto frontier" in result.output
    assert len(out.read_text().strip().splitlines()) == 7
    for name in ("frontier", "devices", "heatmap"):
        assert (tmp_path / "p" / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
        assert ET.parse(tmp_path / "p" / f"{name}.svg").getroot().tag.endswith("svg")
    bad = runner.invoke(main, ["whatif", str(request), "--axis", "budget_per_hour=-1:5:3", "--no-progress"])
    assert bad.exit_code == 2
    assert "axes[0].values" in bad.output
    # two documents on stdout, CSV then JSON, were neither a CSV nor a JSON a tool could read
    both = runner.invoke(
        main, ["whatif", str(request), "--axis", "budget_per_hour=1,2", "--json", "--csv", "-"]
    )
    assert both.exit_code == 2
    assert "--json and --csv - both write to stdout" in both.output


def test_csv_has_one_row_per_point(budget_sweep):
    _, result = budget_sweep
    rows = to_csv(result).strip().splitlines()
    assert len(rows) == len(result.points) + 1
    header = rows[0].split(",")
    assert {"devices:small", "bought:big", "marginal_rps:small", "binding", "frontier"} <= set(header)
    flags = [int(r.split(",")[header.index("frontier")]) for r in rows[1:]]
    assert [i for i, f in enumerate(flags) if f] == result.frontier


def test_chunks_are_contiguous_of_about_equal_weight_and_the_highest_budget_goes_first():
    from fleetplan.whatif.executors import chunks_of

    budgets = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # weights 1 + budget: 1..7, 28 in all
    chunks = chunks_of(list(range(7)), 3, budgets.__getitem__)
    assert chunks == [[6], [4, 5], [0, 1, 2, 3]]  # weights 7, 11, 10
    assert chunks_of(list(range(4)), 2) == [[0, 1], [2, 3]]  # no budgets: equal counts
    assert sorted(i for chunk in chunks for i in chunk) == list(range(7))
    assert chunks_of([4, 2], 5) == [[4], [2]]  # never more chunks than points


def test_http_a_base_request_over_a_server_cap_names_its_field_in_the_body():
    """The cap check named `options.time_limit_s`, a path the what-if body does not have."""
    from fleetplan.api.settings import Settings

    body = _body()
    body["base"]["options"]["time_limit_s"] = 100
    with TestClient(app=create_app(settings=Settings(max_time_limit_s=60))) as client:
        answer = _post(client, body)
    assert answer.status_code == 422
    assert answer.json()["field"] == "base.options.time_limit_s"


def test_cli_refuses_an_unwritable_output_before_the_sweep(tmp_path, monkeypatch):
    """Found after the sweep, an unwritable --plot directory was a FileNotFoundError traceback (the sweep
    lost); an unreachable scheduler was a 70-line traceback."""
    from fleetplan.whatif import executors

    request = tmp_path / "tiny.json"
    request.write_bytes(encode(two_types(small={"max_count": 3}, big={"max_count": 1})))
    runner = CliRunner()
    args = ["whatif", str(request), "--axis", "budget_per_hour=1,2", "--no-progress", "--workers", "1"]
    blocked = tmp_path / "file"
    blocked.write_text("")
    plot = runner.invoke(main, [*args, "--plot", str(blocked / "dir")])
    assert plot.exit_code == 2
    assert plot.stderr.startswith(f"error: --plot: cannot make '{blocked / 'dir'}': Not a directory")
    csv = runner.invoke(main, [*args, "--csv", str(blocked / "points.csv")])
    assert csv.exit_code == 2
    assert "error: --csv: cannot make" in csv.stderr

    class Unreachable:
        def Client(self, address, timeout):  # noqa: N802 (distributed.Client)
            raise OSError(f"Timed out trying to connect to {address} after {timeout}")

    monkeypatch.setattr(executors, "_distributed", Unreachable)
    dask = runner.invoke(main, [*args[:-2], "--scheduler", "tcp://127.0.0.1:1"])
    assert dask.exit_code == 2
    assert dask.stderr.startswith("error: scheduler: cannot reach the Dask scheduler at tcp://127.0.0.1:1")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("budget_per_hour=1:2", "a range is START:STOP:NUM (three numbers), got 2"),
        ("budget_per_hour=1:2:3:4", "got 4"),
        ("budget_per_hour=1:x:3", "could not convert string to float: 'x'"),
        ("budget_per_hour", "give PARAM=START:STOP:NUM or PARAM=V1,V2,..."),
    ],
)
def test_cli_axis_specs_are_explained(spec, says):
    """`budget_per_hour=1:2` said "not enough values to unpack (expected 3, got 2)"."""
    from fleetplan.api.cli_whatif import parse_axis

    with pytest.raises(click.BadParameter, match=re.escape(says)):
        parse_axis(spec)


def test_a_point_served_in_full_on_the_guards_headroom_reaches_only_budgets_that_pay_for_it():
    """bench/fidelity.py's generated request 25 serves every class; its MILP spends 13.16 $/h, but the
    plan served in full within the window guard (solver/window.py, in_full_guarded) takes 13.28 $/h. A
    lower budget reuses a point's plan only where that plan fits it (Reach.answers: its spend), so the
    spend a point keeps is the plan's, not the MILP's: at 13.2 $/h the single plan gives flow up instead."""
    from bench.fidelity import generated
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.pipeline import resolve_profiles
    from fleetplan.whatif.point import solve_request

    request = generated(25)
    solved = solve_request(request, build_candidates(request, resolve_profiles(request)))
    single = plan(request, with_baselines=False)
    assert solved.slo_rps == pytest.approx(single.slo_rps, rel=1e-9)
    assert solved.cost == pytest.approx(single.cost_per_hour, rel=1e-9)
    assert solved.spend == pytest.approx(single.cost_per_hour, rel=1e-9)  # the plan's, above its MILP's
    assert sum(solved.milp_used.values()) >= sum(d.used for d in single.devices)
    assert solved.milp_in_full


def test_a_point_short_of_serving_in_full_plans_one_more_device_itself():
    """A point whose MILP serves every class but whose plan does not (serving it in full on the window
    guard's headroom needs more than the point has: window.in_full_guarded) cannot take the shortcut of the
    marginal values (optimize_above over the plans that beat the point's MILP value: none beats serving
    everything, so every marginal value came out 0): it plans the request with one more device itself.
    Measured (session 33): generated request 25 at 13.2 $/h with 5 A6000 plans 43.37 SLO RPS, with 6
    44.03; the sweep's A6000 marginal value was 0.0, now 0.657 (a sweep over both counts gave 0.657)."""
    from types import SimpleNamespace

    from fleetplan.whatif.point import PointSolver, Solved

    request = two_types(budget=5.0)
    short = Solved("optimal", 43.37, 44.03, 13.2, 0.0, {}, [], None, 0.0, objective=44.03, milp_in_full=True)
    planned = []
    solver = SimpleNamespace(reuse=lambda r: None, solve=lambda r, c: planned.append(r) or "its own plan")
    assert PointSolver.one_more_device(solver, request, None, short, ("small", 1)) == "its own plan"
    assert planned == [request]


def test_the_budget_binds_where_no_device_with_room_fits_what_is_left():
    """Session 34's planner test: at 5 and 19 $/h of paper.json's sweep what was left bought no instance of
    a type with room, yet `budget` was missing from `binding`: the cheapest pool of a full type counted."""
    from fleetplan.solver.candidates import build_candidates
    from fleetplan.solver.pipeline import resolve_profiles
    from fleetplan.whatif.point import budget_binding

    request = two_types(small={"max_count": 4}, big={"max_count": 2}, budget=9.0)
    cand = build_candidates(request, resolve_profiles(request))
    # small (1 $/h) full at 4, big (3 $/h) has room: 2 $/h left buys no big instance
    assert budget_binding(request, cand, 7.0, {"small": 4, "big": 1}) == ["budget"]
    assert budget_binding(request, cand, 6.0, {"small": 4, "big": 1}) == []  # 3 $/h left: a big one fits
    assert budget_binding(request, cand, 7.0, {"small": 3, "big": 1}) == []  # a small one still fits
    assert budget_binding(request, cand, 7.0, {"small": 4, "big": 2}) == []  # every type full: devices bind
    # ... and the budget too where it would not pay for one more of any (test_marginal_value_..._by_hand)
    assert budget_binding(request, cand, 8.5, {"small": 4, "big": 2}) == ["budget"]


def test_a_count_by_max_count_grid_refuses_a_point_with_max_count_below_count_in_either_order():
    """Session 34: (count 12, max_count 8) failed in one axis order and was planned with max_count 12,
    labelled 8, in the other."""
    base = two_types(small={"max_count": 4})
    for axes in (
        ({"param": "count:small", "values": [2, 6]}, {"param": "max_count:small", "values": [4, 8]}),
        ({"param": "max_count:small", "values": [4, 8]}, {"param": "count:small", "values": [2, 6]}),
    ):
        with pytest.raises(ValueError, match="max_count 4 is below count 6 of axes"):
            whatif(base, *axes)
    whatif(base, {"param": "count:small", "values": [2, 3]}, {"param": "max_count:small", "values": [4, 8]})
