"""The neighbourhood search that improves the start on instances too large for the full MIP's root
(fleetplan/solver/neighbourhood.py, optimize.search_neighbourhoods; docs/solvers.md)."""

import numpy as np
import pytest
from form_checks import is_feasible

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.solver import optimize as opt
from fleetplan.solver.backends import Sense, get_backend
from fleetplan.solver.candidates import build_candidates
from fleetplan.solver.neighbourhood import free_pools, improve, neighbourhood_form, neighbourhoods
from fleetplan.solver.pipeline import resolve_profiles


@pytest.fixture(scope="module")
def paper():
    request = read_request(fixtures.request_path("paper"))
    cand = build_candidates(request, resolve_profiles(request))
    clock = opt._Clock.start(request.options)
    model = opt.build_model(cand, clock)
    solver = opt._Solver(get_backend("highs"), clock)
    relaxed = opt.relax_stages(model, opt.STAGES["max_goodput"], solver)
    return request, cand, model, relaxed


def _solve(form, limit, start):
    return get_backend("highs").solve(
        form, form.objectives["goodput"], Sense.MAX, time_limit_s=limit, mip_rel_gap=1e-4, start=start
    )


def test_the_device_neighbourhoods_free_every_pool_once(paper):
    _, cand, model, relaxed = paper
    x = np.zeros(model.cols.n_pools)
    chunks = [chunk for kind, chunk in neighbourhoods(cand) if kind == "devices"]
    freed = np.array([free_pools(cand, x, x, "devices", chunk) for chunk in chunks])
    assert (freed.sum(axis=0) == 1).all()  # each pool in exactly one chunk
    device = cand.pools["device"].to_numpy()
    for row in freed:  # a chunk frees every pool of its device types and no other
        assert set(device[row]).isdisjoint(device[~row])


def test_a_box_moves_the_free_pools_by_one_instance_and_holds_the_others(paper):
    _, cand, model, relaxed = paper
    n = model.cols.n_pools
    x_lp = relaxed[0].values[:n]
    x = np.minimum(np.round(x_lp), model.form.col_hi[:n])
    free = free_pools(cand, x, x_lp, "box", 0)
    assert free.any()
    assert not free.all()
    form = neighbourhood_form(model.form, model.cols, x, free, "box")
    lo, hi = form.col_lo[:n], form.col_hi[:n]
    assert (lo[~free] == x[~free]).all()
    assert (hi[~free] == x[~free]).all()
    assert (lo[free] >= np.maximum(x[free] - 1, 0)).all()
    assert (hi[free] <= x[free] + 1).all()
    assert (form.col_lo[n:] == model.form.col_lo[n:]).all()  # flows and the other columns untouched


def test_improve_beats_a_weak_start_with_a_feasible_plan_no_better_than_the_optimum(paper):
    request, cand, model, relaxed = paper
    n = model.cols.n_pools
    x_lp = relaxed[0].values[:n]
    solver = opt._Solver(get_backend("highs"), opt._Clock.start(request.options))
    # a weak start: the economical LP rounded (rounded_start), its flows re-solved
    weak = opt._rounded_flows(model, relaxed[-1].values, ("goodput", Sense.MAX), solver, 10.0)
    goodput = model.form.objectives["goodput"]
    optimum = opt.optimize(request, cand).primary_value
    assert goodput @ weak < optimum * (1 - 1e-3)  # there is room to improve
    better = improve(
        cand, model.form, model.cols, weak, x_lp, ("goodput", Sense.MAX), _solve, lambda: 1.0, 5.0
    )
    assert is_feasible(model.form, better)
    assert goodput @ better > goodput @ weak + 1e-6
    assert goodput @ better <= optimum * (1 + request.options.mip_rel_gap) + 1e-9


def test_improve_keeps_the_start_when_no_time_is_left(paper):
    request, cand, model, relaxed = paper
    start = opt.optimize(request, cand).values
    calls = []

    def solve(form, limit, begin):
        calls.append(limit)
        return _solve(form, limit, begin)

    kept = improve(
        cand, model.form, model.cols, start, start, ("goodput", Sense.MAX), solve, lambda: 0.0, 1.0
    )
    assert kept is start
    assert calls == []


def test_the_search_runs_only_where_the_first_lp_is_slow(monkeypatch, paper):
    """paper.json's LP takes milliseconds: no neighbourhood, and both LP relaxations (goodput, then cost
    with goodput locked) run. With LNS_LP_S at 0 (as if its LP were slow) only the first LP runs, the
    search is recorded as step "neighbourhood" between the start and the primary MIP, and the plan's
    goodput is the optimum's."""
    request, cand, _, _ = paper
    plain = opt.optimize(request, cand)
    assert "neighbourhood" not in [r.step for r in plain.stages]
    assert [r.stage for r in plain.stages if r.step == "relaxation"] == ["goodput", "cost"]
    monkeypatch.setattr(opt, "LNS_LP_S", 0.0)
    searched = opt.optimize(request, cand)
    assert [r.stage for r in searched.stages if r.step == "relaxation"] == ["goodput"]
    steps = [r.step for r in searched.stages]
    assert "neighbourhood" in steps
    first, last = steps.index("neighbourhood"), len(steps) - 1 - steps[::-1].index("neighbourhood")
    assert steps.index("start") < first
    assert last < steps.index("primary")
    assert all(r.kind == "submip" for r in searched.stages if r.step == "neighbourhood")
    assert searched.primary_value == pytest.approx(plain.primary_value, rel=request.options.mip_rel_gap)


@pytest.mark.parametrize(("root_lps", "share"), [(1.0, opt.LNS_UNTIL), (1e9, opt.LNS_LAST)])
def test_the_search_keeps_the_full_mips_share_only_where_its_root_fits(monkeypatch, paper, root_lps, share):
    """The search ends at LNS_UNTIL of the time limit where the full MIP's share after it holds ROOT_LPS
    first LP relaxations (paper's LP: milliseconds, against 4 s), at LNS_LAST where it does not (ROOT_LPS
    so large that no share holds it): seen as the time the search is given, at a 10 s limit."""
    request, cand, _, _ = paper
    monkeypatch.setattr(opt, "LNS_LP_S", 0.0)
    monkeypatch.setattr(opt, "ROOT_LPS", root_lps)
    given = []

    def improve(cand, form, cols, start, x_lp, stage, solve, time_left, call_s):
        given.append(time_left())
        return start

    monkeypatch.setattr(opt, "improve", improve)
    searched = opt.optimize(request, cand)
    start_ended_s = next(r for r in searched.stages if r.step == "start").ended_ms / 1e3  # since began
    (left,) = given
    expected = share * request.options.time_limit_s - start_ended_s
    assert expected - 0.2 < left <= expected + 0.01
