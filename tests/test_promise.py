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
