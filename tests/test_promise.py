"""The planner's promise on the bundled requests (../docs/formulation.md, "Capacity model"; capacity.md).

Planned at default options (the queueing capacity model), every class a plan serves meets its SLO
percentile in the simulator for 600 s after a 60 s warm-up, on seeds 0, 1 and 2, and the simulated goodput
is within 5% of the planned SLO RPS. bench/fidelity.py checks the same on 30 generated requests besides.
"""

import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.simulator import simulate
from fleetplan.solver import plan
from fleetplan.solver.pipeline import resolve_profiles

BUNDLED = ["paper", "scarce_gpus", "link_bound", "infeasible"]


@pytest.fixture(scope="module", params=BUNDLED)
def planned(request):
    req = read_request(fixtures.request_path(request.param))
    return request.param, req, plan(req, with_baselines=False), resolve_profiles(req)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_served_class_keeps_its_promise(planned, seed):
    name, req, result, table = planned
    assert result.slo_rps > 0, name
    report = simulate(req, result, table, duration_s=600.0, warmup_s=60.0, seed=seed)
    served = {w.name for w in result.workloads if w.served_rps > 0}
    broken = [
        (c.name, c.slo_percentile, getattr(c, f"ttft_ms_p{c.slo_percentile}"), c.slo_ttft_ms)
        for c in report.classes
        if c.name in served and not c.slo_met
    ]
    assert not broken, f"{name} seed {seed}: {broken}"
    assert abs(report.goodput_rps / result.slo_rps - 1.0) <= 0.05, (name, report.goodput_rps, result.slo_rps)


def test_a_class_riding_one_colocated_pool_alone_keeps_its_promise():
    """gen-21's p99 class 3b-long-0 (1024-token prompts, 32 tokens out, p99 TTFT 600 ms) on one TPU v5e,
    colocated only. Until session 23 the plan ran it at 0.45 and predicted p99 TTFT 473 ms; simulated, 626
    and 771 ms on seeds 0 and 2: Erlang C at the mean hold put the slot wait at 0.031 where the simulator
    waits 0.074 of the time. In the benchmark's max-goodput plans such a pool carries a share of classes
    that also ride faster pools, whose percentile hides its tail; alone (here, or in gen-21's and gen-00's
    max_min_fraction plans) it broke. With the slots' load at the holds that fill them
    (capacity.cohort_hold) it runs at 0.35 and keeps its promise."""
    import msgspec

    from bench.fidelity import generated

    base = generated(21)
    request = msgspec.structs.replace(
        base,
        workloads=[w for w in base.workloads if w.name == "3b-long-0"],
        devices=[msgspec.structs.replace(d, count=1) for d in base.devices if d.name == "tpu-v5e"],
        links=[],
        kv_budget_gbps=None,
        options=msgspec.structs.replace(base.options, allow_disaggregated=False),
    )
    result = plan(request, with_baselines=False)
    assert [(p.role, p.device, p.instances) for p in result.pools] == [("colocated", "tpu-v5e", 1)]
    assert result.pools[0].headroom < 0.45
    table = resolve_profiles(request)
    for seed in (0, 1, 2):
        report = simulate(request, result, table, duration_s=600.0, warmup_s=60.0, seed=seed)
        assert all(c.slo_met for c in report.classes if c.predicted_rps > 0), seed


def test_the_fidelity_benchs_replan_is_the_nightly_jobs():
    """bench/fidelity.py --replan judges re-plans: paper.json planned, its demand times 1.25, planned again
    against the first plan with at most 4 moves (the churn limit replan() applies). The re-plan moves at
    most 4 instances, serves at most what a fresh plan of the scaled demand serves, and more than the
    first plan did (it may add instances); the scaled request is what the simulator is handed."""
    from bench.fidelity import replanned
    from fleetplan.replan.diff import diff

    request = read_request(fixtures.request_path("paper"))
    first = plan(request, with_baselines=False)
    again, result = replanned(request, (1.25, 4))
    assert [w.rate_rps for w in again.workloads] == pytest.approx(
        [1.25 * w.rate_rps for w in request.workloads]
    )
    assert diff(first, result).moves <= 4
    fresh = plan(again, with_baselines=False)
    assert result.slo_rps <= fresh.slo_rps * (1 + request.options.mip_rel_gap)
    assert result.slo_rps > first.slo_rps
