"""A plan's wall-clock budget (fleetplan/solver/deadline.py): what the solve leaves for the work after it."""

import time
from types import SimpleNamespace

import msgspec
import pytest

from fleetplan import fixtures
from fleetplan.models.codec import read_request
from fleetplan.models.errors import DeadlineExceeded
from fleetplan.solver import pipeline
from fleetplan.solver.backends import Termination
from fleetplan.solver.deadline import SOLVE_SHARE, Deadline, after_solve_s, holding


def _with_limit(request, seconds: float):
    return msgspec.structs.replace(
        request, options=msgspec.structs.replace(request.options, time_limit_s=seconds)
    )


def test_the_solver_leaves_the_larger_of_the_share_and_the_reserve():
    at = time.monotonic() + 10.0
    share = Deadline(at, 10.0).solver_time_limit(100.0)
    assert SOLVE_SHARE * 10.0 - 0.1 < share <= SOLVE_SHARE * 10.0
    reserved = Deadline(at, 10.0, reserve_s=4.0).solver_time_limit(100.0)
    assert 6.0 - 0.1 < reserved <= 6.0
    assert Deadline(at, 10.0, reserve_s=1.0).solver_time_limit(100.0) == pytest.approx(share, abs=0.1)
    assert Deadline(at, 10.0, reserve_s=4.0).solver_time_limit(2.0) == 2.0  # never above what is asked
    assert Deadline(at, 10.0, reserve_s=20.0).solver_time_limit(2.0) == 0.01  # the floor
    assert holding(None, 3.0) is None
    assert holding(Deadline(at, 10.0), 3.0) == Deadline(at, 10.0, reserve_s=3.0)


def test_the_reserve_grows_with_the_model_and_stays_below_its_size_in_seconds():
    small, medium, large = (sum(after_solve_s(n)) for n in (176, 2306, 18719))  # paper, the bench's M, L
    assert 0.1 < small < medium < large
    assert large < 5.0  # the bench's L plans in 10 s: its reserve must leave its solve most of them


def test_a_plan_whose_deadline_leaves_less_than_its_reserve_is_refused_before_solving(monkeypatch):
    request = read_request(fixtures.request_path("paper"))
    monkeypatch.setattr(pipeline, "after_solve_s", lambda n: (20.0, 40.0))
    solved = []
    monkeypatch.setattr(pipeline, "optimize_or_fall_back", lambda *a: solved.append(a))
    with pytest.raises(DeadlineExceeded) as caught:
        pipeline.plan(request, deadline=Deadline.after(30.0))
    assert not solved
    assert caught.value.field == "options.time_limit_s"
    message = str(caught.value)
    assert "no plan within time_limit_s=30" in message
    assert "needs about 60.00 s" in message
    assert "176 candidate uses" in message


class _Solved(Exception):
    pass


def _solver_sees(monkeypatch, request, deadline) -> tuple[float, float, float]:
    """(time limit, seconds left, reserve) the main solve is handed by plan() under `deadline`."""
    seen = []

    def optimize(request, cand, deadline):
        seen.append((request.options.time_limit_s, deadline.remaining(), deadline.reserve_s))
        raise _Solved

    monkeypatch.setattr(pipeline, "optimize_or_fall_back", optimize)
    with pytest.raises(_Solved):
        pipeline.plan(request, deadline=deadline)
    (limit_left_reserve,) = seen
    return limit_left_reserve


@pytest.mark.parametrize(("objective", "held"), [("max_goodput", 10.0), ("min_cost", 6.0)])
def test_the_main_solve_leaves_the_models_reserve(monkeypatch, objective, held):
    """The solver's time limit under a deadline ends the reserve before it: the guard's part (4 s here) and
    the rest's (6 s); a min_cost plan, which the window guard does not touch, holds back only the rest."""
    request = _with_limit(read_request(fixtures.request_path("link_bound")), 60.0)
    options = msgspec.structs.replace(request.options, objective=objective)
    request = msgspec.structs.replace(request, options=options)
    monkeypatch.setattr(pipeline, "after_solve_s", lambda n: (4.0, 6.0))
    limit, left, reserve = _solver_sees(monkeypatch, request, Deadline.after(30.0))
    assert reserve == held
    assert left - held <= limit < left - held + 0.5  # the limit was taken a moment before


def test_the_pooled_credit_runs_in_what_the_solve_left_beyond_the_reserve():
    """A 60 s budget of which 10 s remain when the plan begins (as after a long candidate build): the solve
    leaves at least 20% of that, 2 s, under a quarter of the budget (which skipped the credit before) but
    far more than the guard, the plan's assembly and verification need for link_bound, whose pooled credit
    serves more than its MILP."""
    request = _with_limit(read_request(fixtures.request_path("link_bound")), 60.0)
    result = pipeline.plan(request, with_baselines=False, deadline=Deadline(time.monotonic() + 10.0, 60.0))
    assert "pooled" in [stage.step for stage in result.solver.stages]


def test_the_window_guard_holds_back_only_the_share(monkeypatch):
    """settle: the pooled credit (a gain) and the re-solve of a plan served in full give way to the reserve,
    the window guard (the promise) never."""
    from fleetplan.solver import window

    handed = {}

    def credit(request, cand, outcome, deadline):
        handed["credit"] = deadline.reserve_s
        return cand, outcome

    def guard(request, cand, outcome, deadline):
        handed["guard"] = deadline.reserve_s
        return cand, outcome

    def in_full(request, cand, outcome, deadline):
        handed["in_full"] = deadline.reserve_s
        return cand, outcome

    monkeypatch.setattr(window, "in_full_guarded", in_full)
    monkeypatch.setattr(window, "pool_credit", credit)
    monkeypatch.setattr(window, "window_guard", guard)
    cand = SimpleNamespace(uses=range(2306))
    window.settle(None, cand, None, Deadline.after(10.0))
    reserve = pytest.approx(sum(after_solve_s(2306)))
    assert handed == {"in_full": reserve, "credit": reserve, "guard": 0.0}


def test_no_plan_in_the_time_the_deadline_left_says_so():
    request = _with_limit(read_request(fixtures.request_path("paper")), 4.8638)
    outcome = SimpleNamespace(termination="no_solution")
    capped = pipeline._no_plan_message(request, outcome, Deadline.after(10.0))
    assert "found no plan (no_solution) in the 4.86 s that time_limit_s=10 left the solve" in capped
    assert "within time_limit_s=4.8638;" in pipeline._no_plan_message(request, outcome, None)
    # a proof that no plan exists does not ask for more time (session 34: a churn limit read "raise the time
    # limit", which finds nothing more)
    proven = pipeline._no_plan_message(request, SimpleNamespace(termination=Termination.INFEASIBLE), None)
    assert "proved that no plan meets the request's constraints (infeasible); more time will not" in proven
    assert "raise the time limit" not in proven


def test_a_small_time_limit_of_the_request_is_not_the_deadlines(monkeypatch):
    """A request asking 10 ms of solver time under a generous deadline is solved with its 10 ms, not
    refused as if the deadline had run out."""
    request = _with_limit(read_request(fixtures.request_path("paper")), 0.01)
    limit, _, _ = _solver_sees(monkeypatch, request, Deadline.after(30.0))
    assert limit == 0.01


def test_a_min_cost_fallback_gets_what_is_left_of_the_limit(monkeypatch):
    """A min_cost request the fleet cannot serve falls back to the max-goodput plan, which gets the time
    limit less what the min_cost attempt took (before: the whole limit again, past a deadline)."""
    from fleetplan.solver import window
    from fleetplan.solver.backends import Termination
    from fleetplan.solver.candidates import build_candidates

    request = _with_limit(read_request(fixtures.request_path("paper")), 5.0)
    options = msgspec.structs.replace(request.options, objective="min_cost")
    request = msgspec.structs.replace(request, options=options)

    def infeasible(request, cand, deadline):
        time.sleep(0.5)
        return SimpleNamespace(termination=Termination.INFEASIBLE)

    limits = []

    def optimize(request, cand):
        limits.append(request.options.time_limit_s)
        return "max_goodput"

    monkeypatch.setattr(window, "optimize_guarded", infeasible)
    monkeypatch.setattr(window, "optimize", optimize)
    cand = build_candidates(request, pipeline.resolve_profiles(request))
    assert window.optimize_or_fall_back(request, cand, None) == ("max_goodput", True)
    (limit,) = limits
    assert 4.0 < limit <= 4.5


@pytest.mark.parametrize("under_deadline", [False, True])
def test_a_min_cost_plans_capped_tables_take_their_time_from_the_deadline_only(monkeypatch, under_deadline):
    """optimize_guarded: the capped tables (prior_tables, here made to take 0.3 s) come out of the first
    solve's limit under a deadline, which they would otherwise overrun; without one the first solve keeps
    the request's whole limit (a short min_cost limit would leave it no time)."""
    from fleetplan.solver import window

    request = _with_limit(read_request(fixtures.request_path("paper")), 5.0)
    request = msgspec.structs.replace(
        request, options=msgspec.structs.replace(request.options, objective="min_cost")
    )
    limits = []

    def slow_prior(request, cand):
        time.sleep(0.3)
        return cand

    def optimize(request, cand):
        limits.append(request.options.time_limit_s)
        return SimpleNamespace(termination=window.Termination.OPTIMAL, values=None, candidates=cand)

    monkeypatch.setattr(window, "prior_tables", slow_prior)
    monkeypatch.setattr(window, "optimize", optimize)
    monkeypatch.setattr(window, "capped_tables", lambda request, cand, outcome: None)
    cand = SimpleNamespace(churn=None)
    window.optimize_guarded(request, cand, Deadline.after(60.0) if under_deadline else None)
    if under_deadline:
        assert limits[0] < 5.0 - 0.25
    else:
        assert limits == [5.0]
