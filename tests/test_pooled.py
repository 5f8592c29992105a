"""The join-shortest-queue credit of pools of several instances (fleetplan/solver/pooled.py)."""

import dataclasses

import numpy as np
import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.solver import pipeline, pooled
from fleetplan.solver.candidates import build_candidates
from fleetplan.solver.headroom import pooled_rho
from fleetplan.solver.pipeline import plan, resolve_profiles


@pytest.fixture(scope="module")
def scarce():
    return read_request(fixtures.request_path("scarce_gpus"))


@pytest.fixture(scope="module")
def link_bound():
    """A bundled request whose pooled credit serves more than its MILP (145.0 SLO RPS against the MILP's
    bound of 141.3)."""
    return read_request(fixtures.request_path("link_bound"))


def _without_credit(request, monkeypatch):
    monkeypatch.setattr(pipeline, "settle", lambda request, cand, outcome, deadline, **_: (cand, outcome))
    return plan(request, with_baselines=False)


def test_credit_serves_more_on_the_same_hardware(link_bound, monkeypatch):
    from fleetplan.solver import window

    # the credit alone (the window guard after it has its own tests, tests/test_window.py)
    monkeypatch.setattr(window, "window_guard", lambda request, cand, outcome, deadline=None: (cand, outcome))
    credited = plan(link_bound, with_baselines=False)
    assert [s.step for s in credited.solver.stages][-1] == "pooled"
    milp = _without_credit(link_bound, monkeypatch)
    assert credited.slo_rps > milp.slo_rps + 1e-6
    # the MILP's hardware: same devices and cost, no pool smaller than the MILP made it
    assert [d.used for d in credited.devices] == [d.used for d in milp.devices]
    assert credited.cost_per_hour == pytest.approx(milp.cost_per_hour)
    # the reported bound is the MILP's, and the pass says what it served in its records (the best is kept)
    pooled = [s.objective for s in credited.solver.stages if s.step == "pooled"]
    assert max(pooled) == pytest.approx(credited.slo_rps, rel=1e-6)
    # pools report the credited headroom and run within it (plan() ran verify() on every capacity row).
    # The credit keeps each pool's instances, so a pool is matched by its shape and instance count: its
    # group number follows its headroom, and changes when the credit raises one group above a sibling
    milp_headroom: dict[tuple, float] = {}
    for p in milp.pools:
        key = (p.model, p.role, p.device, p.tp, p.batch, p.instances)
        milp_headroom[key] = max(milp_headroom.get(key, 0.0), p.headroom)
    raised = [
        p
        for p in credited.pools
        if p.headroom > milp_headroom.get((p.model, p.role, p.device, p.tp, p.batch, p.instances), 1.0)
    ]
    assert raised
    assert all(p.instances >= 2 for p in raised)
    assert all(p.utilization <= p.headroom + 1e-9 for p in credited.pools)


def test_pooled_rho_grows_with_the_instance_count_and_is_the_model_at_one(scarce):
    cand = build_candidates(scarce, resolve_profiles(scarce))
    # each use its own queue (a pool of its own), so its FIFO share is 1
    alone = dataclasses.replace(cand, uses=cand.uses.assign(pool=np.arange(len(cand.uses))), memo={})
    rows = np.arange(len(cand.uses))
    single = pooled_rho(alone, rows, np.ones(len(rows)))
    two = pooled_rho(alone, rows, np.full(len(rows), 2))
    eight = pooled_rho(alone, rows, np.full(len(rows), 8))
    assert (two >= single - 1e-12).all()
    assert (eight >= two - 1e-12).all()
    assert (eight > single + 1e-12).any()
    # one instance, alone in its queue: at least the MILP's admissible load (its shares were shape-wide)
    assert (single >= cand.uses["rho"].to_numpy() - 1e-9).all()


def test_no_credit_under_the_flat_model_or_other_objectives(scarce):
    import msgspec

    for options in ({"capacity_model": "flat"}, {"objective": "min_cost"}):
        request = msgspec.structs.replace(scarce, options=msgspec.structs.replace(scarce.options, **options))
        cand = build_candidates(request, resolve_profiles(request))
        outcome, _ = pipeline._solve(request, cand)
        assert pooled.pool_credit(request, cand, outcome) == (cand, outcome)


def test_no_credit_when_the_deadline_leaves_too_little(link_bound):
    from fleetplan.solver.deadline import Deadline

    cand = build_candidates(link_bound, resolve_profiles(link_bound))
    outcome, _ = pipeline._solve(link_bound, cand)
    spent = Deadline.after(0.1 * 10.0)  # 10% of a 10 s budget left
    late = Deadline(spent.at, 10.0, reserve_s=2.0)  # less left than the rest of the plan needs
    assert pooled.pool_credit(link_bound, cand, outcome, late) == (cand, outcome)
    credited = pooled.pool_credit(link_bound, cand, outcome, Deadline.after(10.0))
    assert credited[1].stages[-1].step == "pooled"
    # the same second left, nothing held back for the rest: the credit's LPs take milliseconds here
    assert pooled.pool_credit(link_bound, cand, outcome, Deadline.after(1.0))[1].stages[-1].step == "pooled"


def test_the_summary_says_the_bound_is_the_milps_when_the_credit_served_more(link_bound, monkeypatch):
    from fleetplan.api.render import objective_text

    credited = plan(link_bound, with_baselines=False)
    assert credited.slo_rps > credited.bound_rps  # the credit passed the MILP's bound
    assert "(MILP; + pooled credit)" in objective_text(credited)
    assert "pooled" not in objective_text(_without_credit(link_bound, monkeypatch))


def test_credit_applies_to_a_pool_that_runs_every_instance_its_devices_allow(monkeypatch):
    """A pool at its device limit: the MILP bounds its flows by `rho r x_hi` (formulation.column_bounds),
    which the credit must lift with the headroom, or it is no credit there. One class far beyond what four
    TPUs serve, colocated only: the plan runs all four and serves more than the MILP's headroom allows."""
    from fleetplan.models.fleet import Device
    from fleetplan.models.plan import Options, PlanRequest
    from fleetplan.models.profile import ProfilesSpec
    from fleetplan.models.workload import Slo, Workload

    request = PlanRequest(
        devices=[Device(name="tpu-v5e", count=4, memory_gib=16.0, cost_per_hour=1.2, network_gbps=25.0)],
        workloads=[
            Workload(
                name="short",
                model="mistral-7b",
                prompt_tokens=128,
                output_tokens=32,
                rate_rps=500.0,
                slo=Slo(ttft_ms=160.0, tbt_ms=40.0, percentile=90),
            )
        ],
        profiles=ProfilesSpec(set="paper"),
        options=Options(allow_disaggregated=False),
    )
    credited = plan(request, with_baselines=False)
    milp = _without_credit(request, monkeypatch)
    assert [(p.role, p.instances) for p in milp.pools] == [("colocated", 4)]
    assert [s.step for s in credited.solver.stages][-1] == "pooled"
    assert credited.slo_rps > 1.2 * milp.slo_rps
    assert [(p.role, p.instances) for p in credited.pools] == [("colocated", 4)]
    assert credited.pools[0].headroom > milp.pools[0].headroom


def test_credit_runs_a_split_shape_as_one_pool_where_the_model_credits_that_more(monkeypatch):
    """The MILP may split one pool shape into headroom levels or mixes of a few instances each, without
    knowing the credit. Generated request 16 of bench/fidelity.py: one pool of that shape, carrying every
    class its instances carried, is credited more than the split, so the plan runs it that way: on the
    same devices and cost, fewer pools, more SLO RPS, every pool within its headroom (plan() verifies)."""
    from bench.fidelity import generated

    request = generated(16)
    merged = plan(request, with_baselines=False)
    monkeypatch.setattr(pooled, "_merged", lambda *args: None)
    split = plan(request, with_baselines=False)
    assert merged.slo_rps > split.slo_rps * (1 + 1e-3)
    assert [d.used for d in merged.devices] == [d.used for d in split.devices]
    assert merged.cost_per_hour == pytest.approx(split.cost_per_hour)

    def shapes(result):
        counted: dict[tuple, list[int]] = {}
        for p in result.pools:
            counted.setdefault((p.model, p.role, p.device, p.tp, p.batch), []).append(p.instances)
        return counted

    before, after = shapes(split), shapes(merged)
    assert before.keys() == after.keys()
    assert {k: sum(v) for k, v in before.items()} == {k: sum(v) for k, v in after.items()}
    joined = [k for k in after if len(after[k]) == 1 < len(before[k])]
    assert joined
    assert all(p.utilization <= p.headroom + 1e-9 for p in merged.pools)


def test_capacity_coefficients_are_set_as_a_lil_assignment_would():
    """pooled._with_capacity_coefficients edits the CSR arrays in place of a LIL round trip: the same
    matrix, entry for entry, where the coefficient exists and where it was 0 (absent)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    for trial in range(50):
        n = int(rng.integers(5, 40))
        start = int(rng.integers(0, 20))
        lil = sp.random(start + n + 10, n + 15, density=0.1, format="lil", random_state=trial)
        for p in range(n):
            lil[start + p, p] = -rng.random() if rng.random() < 0.8 else 0.0
        A = lil.tocsr()
        A.eliminate_zeros()
        pools = np.flatnonzero(rng.random(n) < 0.5)
        rho = rng.random(n)
        expected = A.tolil(copy=True)
        for p in pools:
            expected[start + p, p] = -rho[p]
        got = pooled._with_capacity_coefficients(A, start, pools, rho)
        assert np.array_equal(got.toarray(), expected.toarray()), trial
        assert np.array_equal(A.toarray(), lil.toarray())  # the input is left as it was
