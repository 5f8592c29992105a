"""The warm worker pool (fleetplan/api/workers.py): workers persist across requests, and every way a request
can end without an answer (deadline, cancellation, crash, shutdown) kills its worker and starts a fresh one.

Workers fork from the test process (cli_context), so the module-level functions below are what they run.
"""

import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_service import _gone

from fleetplan.api.workers import SolvePool, WorkerCrashed, cli_context
from fleetplan.models.errors import DeadlineExceeded, InputError

TIMED_OUT = DeadlineExceeded("stopped")


def _pid(deadline: object) -> int:
    return os.getpid()


def _refuse(deadline: object) -> None:
    raise InputError("bad input", field="x")


def _die(deadline: object) -> None:
    os._exit(3)


def _raise(deadline: object) -> None:
    raise RuntimeError("a bug")


def _unpicklable(deadline: object) -> object:
    return lambda: None


def _hang(pid_file: Path, deadline: object) -> None:
    pid_file.write_text(str(os.getpid()))
    time.sleep(60)


def _pool(**kwargs: Any) -> SolvePool:
    # workers forked from a pytest process count its pages as their own resident memory, which after a few
    # hundred tests can pass the service's cap: only the test of that rule sets one
    kwargs.setdefault("max_worker_rss_mib", 1e6)
    return SolvePool(slots=1, queue=1, context=cli_context, **kwargs)


def _call(pool: SolvePool, work: Any, limit_s: float = 10.0) -> Any:
    async def main() -> Any:
        return await pool.call(work, (), time.monotonic() + limit_s, limit_s, TIMED_OUT)

    return anyio.run(main)


def _idle_pids(pool: SolvePool, count: int = 1) -> list[int]:
    """The idle workers' pids, once `count` are idle (replacements start in the background)."""
    for _ in range(200):
        if len(pool._idle) >= count:
            break
        time.sleep(0.05)
    return [w.process.pid for w in pool._idle]


@pytest.fixture
def pool() -> Any:
    made = _pool()
    yield made
    made.kill_all()


def test_one_warm_worker_answers_request_after_request(pool: SolvePool) -> None:
    pool.warm()
    (warm,) = _idle_pids(pool)
    assert [_call(pool, _pid) for _ in range(3)] == [warm] * 3
    with pytest.raises(InputError):  # a planner error is an answer: the worker stays
        _call(pool, _refuse)
    assert _call(pool, _pid) == warm
    assert pool.replaced == 0
    assert not pool._children


def test_a_worker_killed_at_the_deadline_is_replaced(pool: SolvePool, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    began = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        _call(pool, partial(_hang, pid_file), limit_s=0.5)
    assert time.monotonic() - began < 2
    hung = int(pid_file.read_text())
    assert _gone(hung)  # killed and reaped before the answer
    (fresh,) = _idle_pids(pool)
    assert fresh != hung
    assert pool.replaced == 1
    assert _call(pool, _pid) == fresh


def test_a_cancelled_request_kills_its_worker(pool: SolvePool, tmp_path: Path) -> None:
    """A client that disconnects cancels its request's task: the worker is killed with it."""
    pid_file = tmp_path / "pid"

    async def main() -> None:
        with anyio.move_on_after(0.5):
            await pool.call(partial(_hang, pid_file), (), time.monotonic() + 30, 30, TIMED_OUT)

    anyio.run(main)
    assert _gone(int(pid_file.read_text()))
    assert pool.running == 0
    assert not pool._children
    assert _idle_pids(pool)
    assert pool.replaced == 1


@pytest.mark.parametrize("work", [_die, _raise, _unpicklable])
def test_a_crashed_worker_is_an_error_and_is_replaced(pool: SolvePool, work: Any) -> None:
    pool.warm()
    (before,) = _idle_pids(pool)
    with pytest.raises(WorkerCrashed):
        _call(pool, work)
    assert _gone(before)
    (after,) = _idle_pids(pool)
    assert after != before
    assert _call(pool, _pid) == after


def test_a_worker_over_its_memory_bound_is_replaced_after_its_answer() -> None:
    pool = _pool(max_worker_rss_mib=1)  # every worker is over it
    try:
        first = _call(pool, _pid)
        assert _gone(first)
        assert _call(pool, _pid) != first
    finally:
        pool.kill_all()


def test_shutdown_kills_idle_workers_and_refuses_work(pool: SolvePool) -> None:
    pool.warm()
    (idle,) = _idle_pids(pool)
    pool.kill_all()
    assert _gone(idle)
    assert not pool._idle
    with pytest.raises(Exception, match="shutting down"):
        _call(pool, _pid)


def _slow_build(done_file: Path, seconds: float, deadline: Any) -> None:
    """A plan whose candidate build takes `seconds`: it reports the stage as solver.plan does, writes
    `done_file` when the tables are built, then stops at the deadline's check (past by then)."""
    deadline.enter("candidates")
    time.sleep(seconds)
    done_file.write_text(str(os.getpid()))
    deadline.enter("solve")
    deadline.check("candidate generation")


def _building_call(pool: SolvePool, work: Any, limit_s: float) -> Any:
    async def main() -> Any:
        at = time.monotonic() + limit_s
        return await pool.solve(work, (), at, limit_s, TIMED_OUT, finish_building=True)

    return anyio.run(main)


def test_a_candidate_build_outlives_its_deadline_and_its_worker_is_kept(
    pool: SolvePool, tmp_path: Path
) -> None:
    """At its deadline the request is answered (503, the build still running), but the worker finishes
    the build, holding its slot, and goes back to the idle workers with the tables: the next request finds
    them."""
    done = tmp_path / "built"
    pool.warm()
    (warm,) = _idle_pids(pool)
    seen: dict[str, Any] = {}

    async def main() -> None:
        began = time.monotonic()
        with pytest.raises(DeadlineExceeded) as error:
            await pool.solve(
                partial(_slow_build, done, 1.5), (), began + 0.5, 0.5, TIMED_OUT, finish_building=True
            )
        seen["answered_s"] = time.monotonic() - began
        seen["error"] = error.value
        seen["running"], seen["finishing"], seen["built_yet"] = pool.running, pool.finishing, done.exists()
        await anyio.sleep(2.5)  # the build ends meanwhile; the task that waits for it frees the slot

    anyio.run(main)
    assert seen["answered_s"] < 1.2  # answered at the deadline, not at the end of the build
    assert "building this fleet's candidate tables" in seen["error"].message
    assert seen["error"].retry_after_s >= 1
    assert (seen["running"], seen["finishing"], seen["built_yet"]) == (1, 1, False)  # the slot stays held
    assert int(done.read_text()) == warm  # the build finished, in the same worker
    assert (pool.running, pool.finishing) == (0, 0)
    assert _idle_pids(pool) == [warm]  # kept, not killed
    assert pool.replaced == 0
    assert _call(pool, _pid) == warm


def test_a_worker_not_building_at_the_deadline_is_still_killed(pool: SolvePool, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(DeadlineExceeded) as error:
        _building_call(pool, partial(_hang, pid_file), limit_s=0.5)
    assert error.value is TIMED_OUT
    assert _gone(int(pid_file.read_text()))
    assert pool.replaced == 1


def test_a_build_past_the_finishing_limit_is_killed(tmp_path: Path) -> None:
    """The finishing is bounded: a build still running finish_limit_s after its deadline is killed, its
    worker replaced, and the slot freed."""
    made = _pool(finish_limit_s=0.5)
    seen: dict[str, Any] = {}

    async def main() -> None:
        at = time.monotonic() + 0.3
        with pytest.raises(DeadlineExceeded):
            await made.solve(
                partial(_slow_build, tmp_path / "built", 30.0), (), at, 0.3, TIMED_OUT, finish_building=True
            )
        seen["finishing"] = made.finishing
        await anyio.sleep(1.0)  # past the finishing limit

    try:
        made.warm()
        (warm,) = _idle_pids(made)
        anyio.run(main)
        assert seen["finishing"] == 1
        assert _gone(warm)
        assert (made.running, made.finishing) == (0, 0)
        assert not (tmp_path / "built").exists()
        assert made.replaced == 1
        assert _idle_pids(made) != [warm]
    finally:
        made.kill_all()


def test_at_most_half_the_slots_finish_builds_at_once(tmp_path: Path) -> None:
    """With two slots one build may finish past its deadline; a second one at the same time is killed at
    its deadline, as any other work."""
    made = SolvePool(slots=2, queue=2, context=cli_context, max_worker_rss_mib=1e6)
    errors: list[DeadlineExceeded] = []

    async def one(name: str) -> None:
        at = time.monotonic() + 0.5
        try:
            await made.solve(
                partial(_slow_build, tmp_path / name, 2.0), (), at, 0.5, TIMED_OUT, finish_building=True
            )
        except DeadlineExceeded as error:
            errors.append(error)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(one, "first")
            group.start_soon(one, "second")
        await anyio.sleep(2.5)

    try:
        anyio.run(main)
        assert len(errors) == 2
        assert sorted(error is TIMED_OUT for error in errors) == [False, True]  # one finishes, one is killed
        assert len(list(tmp_path.iterdir())) == 1
        assert (made.running, made.finishing) == (0, 0)
    finally:
        made.kill_all()


def _slow_plan(request: Any, store: Any, deadline: Any) -> None:
    deadline.enter("candidates")
    time.sleep(30)


def _slow_solve(request: Any, store: Any, deadline: Any) -> None:
    deadline.enter("candidates")
    deadline.enter("solve")
    time.sleep(30)


def test_the_cli_says_when_its_time_ran_out_in_the_candidate_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's worker is stopped at the deadline with its build; its error says that, and what to do."""
    from fleetplan import fixtures
    from fleetplan.api import workers
    from fleetplan.models.codec import read_request

    monkeypatch.setattr(workers, "plan_in_child", _slow_plan)
    request = read_request(fixtures.request_path("paper"))
    began = time.monotonic()
    with pytest.raises(DeadlineExceeded) as error:
        workers.solve_blocking(request, None, time.monotonic() + 0.8)
    assert time.monotonic() - began < 3
    assert "building this fleet's candidate tables takes longer" in error.value.message
    assert "larger time limit" in error.value.message
    monkeypatch.setattr(workers, "plan_in_child", _slow_solve)
    with pytest.raises(DeadlineExceeded) as other:
        workers.solve_blocking(request, None, time.monotonic() + 0.5)
    assert "building" not in other.value.message  # not building: the plain time-out
