"""The candidate cache (solver/candidates.py, build_candidates): a request that differs from a cached one only
in what the candidate tables do not read gets the same tables a fresh build gives, with its own demand; a
change to anything they read misses the cache."""

import msgspec
import pandas as pd
import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.solver import candidates, plan
from fleetplan.solver.pipeline import resolve_profiles

FRAMES = ("classes", "latency", "pools", "uses", "devices")


@pytest.fixture(scope="module")
def paper():
    request = read_request(fixtures.request_path("paper"))
    return request, resolve_profiles(request)


def _variant(request, rate_scale=1.0, weight=1.0, **options):
    workloads = [
        msgspec.structs.replace(w, rate_rps=w.rate_rps * rate_scale, weight=weight) for w in request.workloads
    ]
    return msgspec.structs.replace(
        request, workloads=workloads, options=msgspec.structs.replace(request.options, **options)
    )


def _fresh(request, table):
    candidates.clear_candidates_cache()
    return candidates.build_candidates(request, table)


def test_demand_budget_and_solver_options_reuse_the_tables(paper):
    request, table = paper
    candidates.clear_candidates_cache()
    candidates.build_candidates(request, table)  # warm
    variant = _variant(request, rate_scale=2.5, weight=3.0, budget_per_hour=20.0, mip_rel_gap=1e-3)
    assert candidates.candidates_key(variant, table) == candidates.candidates_key(request, table)
    cached = candidates.build_candidates(variant, table)
    fresh = _fresh(variant, table)
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(cached, name), getattr(fresh, name))
    assert cached.request is variant
    expected = [w.rate_rps * 2.5 for w in request.workloads]
    assert cached.classes["rate_rps"].tolist() == pytest.approx(expected)
    assert (cached.classes["weight"] == 3.0).all()


def test_what_the_tables_read_misses_the_cache(paper):
    request, table = paper
    base = candidates.candidates_key(request, table)
    tighter = [
        msgspec.structs.replace(w, slo=msgspec.structs.replace(w.slo, ttft_ms=w.slo.ttft_ms * 0.5))
        for w in request.workloads
    ]
    changed = [
        msgspec.structs.replace(request, workloads=tighter),
        _variant(request, max_utilization=0.6),
        _variant(request, capacity_model="flat"),
        msgspec.structs.replace(request, devices=request.devices[:-1]),
    ]
    keys = {candidates.candidates_key(r, table) for r in changed}
    assert base not in keys
    assert len(keys) == len(changed)
    # and a tighter SLO really changes the tables (the key is not merely longer)
    candidates.clear_candidates_cache()
    loose = candidates.build_candidates(request, table).uses["rho"].to_numpy()
    tight = candidates.build_candidates(changed[0], table).uses["rho"].to_numpy()
    assert len(loose) != len(tight) or (loose != tight).any()


def test_a_plan_from_cached_tables_equals_one_from_fresh_tables(paper):
    request, table = paper
    request = msgspec.structs.replace(request, workloads=request.workloads[:2])  # a small MILP
    variant = _variant(request, rate_scale=0.6)
    candidates.clear_candidates_cache()
    candidates.build_candidates(request, table)  # the cache holds the base request's tables
    cached = plan(variant, with_baselines=False)
    candidates.clear_candidates_cache()
    fresh = plan(variant, with_baselines=False)
    assert cached.slo_rps == pytest.approx(fresh.slo_rps, rel=1e-9)
    assert [(p.device, p.role, p.instances) for p in cached.pools] == [
        (p.device, p.role, p.instances) for p in fresh.pools
    ]
