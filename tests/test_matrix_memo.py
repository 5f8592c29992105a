"""formulation.matrix_for on a what-if sweep's tables (with_matrix_memo): one model per request but for its
budget, each call with its own budget; never a kept model for other tables, devices or options, and none
kept on the tables a plain plan() gets (the candidate cache's, kept across a service's requests)."""

import dataclasses

import msgspec
import numpy as np
import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.solver.candidates import build_candidates, device_table
from fleetplan.solver.formulation import MatrixForm, build_matrix, fleet_cost, matrix_for, with_matrix_memo
from fleetplan.solver.pipeline import resolve_profiles


def _at(request, budget):
    options = msgspec.structs.replace(request.options, budget_per_hour=budget)
    return msgspec.structs.replace(request, options=options)


BOUNDS = ("row_lo", "row_hi", "col_lo", "col_hi")


def _equal(a: MatrixForm, b: MatrixForm) -> bool:
    return (
        a.A.shape == b.A.shape
        and (a.A != b.A).nnz == 0
        and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in BOUNDS)
        and np.array_equal(a.integer, b.integer)
        and a.row_blocks == b.row_blocks
        and a.objectives.keys() == b.objectives.keys()
        and all(np.array_equal(a.objectives[k], b.objectives[k]) for k in a.objectives)
    )


@pytest.fixture
def paper_at_14():
    request = _at(read_request(fixtures.request_path("paper")), 14.0)
    return with_matrix_memo(build_candidates(request, resolve_profiles(request)))


def test_plain_candidates_keep_no_model():
    request = _at(read_request(fixtures.request_path("paper")), 14.0)
    cand = build_candidates(request, resolve_profiles(request))
    first, _ = matrix_for(cand)
    again, _ = matrix_for(cand)
    assert again.A is not first.A
    assert "matrices" not in cand.memo
    assert _equal(again, first)


def test_another_budget_reuses_the_model_with_its_own_budget_rows(paper_at_14):
    first, _ = matrix_for(paper_at_14)
    at_9 = dataclasses.replace(paper_at_14, request=_at(paper_at_14.request, 9.0))
    form, cols = matrix_for(at_9)
    assert form.A is first.A  # built once
    fresh, fresh_cols = build_matrix(at_9)
    assert _equal(form, fresh)
    assert cols.size == fresh_cols.size
    (begin, end) = [(b, e) for name, b, e in form.row_blocks if name == "budget"][0]
    assert form.row_hi[begin:end].tolist() == [9.0, 9.0]
    assert first.row_hi[begin:end].tolist() == [14.0, 14.0]  # the first caller's copy is its own
    # no budget is the same model with its rows at the fleet's cost (formulation.budget_row)
    unbudgeted = dataclasses.replace(paper_at_14, request=_at(paper_at_14.request, None))
    form, _ = matrix_for(unbudgeted)
    assert form.A is first.A
    assert _equal(form, build_matrix(unbudgeted)[0])
    assert form.row_hi[begin:end].tolist() == [fleet_cost(unbudgeted.request)] * 2


def test_a_callers_changes_to_its_bounds_do_not_reach_the_kept_model(paper_at_14):
    form, _ = matrix_for(paper_at_14)
    form.col_hi[:] = 0.0
    form.row_hi[:] = -1.0
    again, _ = matrix_for(paper_at_14)
    assert _equal(again, build_matrix(paper_at_14)[0])


@pytest.mark.parametrize("change", ["one more device", "other pools", "other option"])
def test_anything_but_the_budget_builds_anew(paper_at_14, change):
    kept, _ = matrix_for(paper_at_14)
    request = paper_at_14.request
    if change == "one more device":
        first, *others = request.devices
        devices = [msgspec.structs.replace(first, count=first.count + 1), *others]
        more = msgspec.structs.replace(request, devices=devices)
        other = dataclasses.replace(paper_at_14, request=more, devices=device_table(more))
    elif change == "other pools":
        pools = paper_at_14.pools.assign(rho=paper_at_14.pools["rho"] * 0.9)
        other = dataclasses.replace(paper_at_14, pools=pools)
    else:
        options = msgspec.structs.replace(request.options, objective="min_cost")
        other = dataclasses.replace(paper_at_14, request=msgspec.structs.replace(request, options=options))
    form, _ = matrix_for(other)
    assert form.A is not kept.A
    assert _equal(form, build_matrix(other)[0])
