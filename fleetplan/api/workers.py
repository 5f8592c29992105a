"""Solves in warm worker processes that can be stopped: the bound behind `options.time_limit_s`.

A thread running HiGHS or a pandas merge cannot be interrupted, so a solve runs in a worker process:
`solver.plan` gets the request's deadline (checked between stages, and capping the solver's time limit),
and the parent kills the worker when the deadline passes, when the client disconnects, or when the server
shuts down. Nothing of a request runs after its answer (but one thing, below: a candidate build): a worker
either has answered (and waits, idle, on its pipe) or is killed before the request is answered.

Workers are persistent. `SolvePool` keeps up to `slots` of them idle, started from a fork server that has
the solver imported and warmed (fleetplan/api/warmup.py plans one small request there), so a request pays
only for its job pickled down a pipe and its answer pickled back (about a millisecond for the paper
request), not for a process start. A worker lives as long as it answers: one that is killed (deadline,
client gone), crashes (exits without an answer, or its work raises an unexpected error: a 500, logged) or
holds more than `max_worker_rss_mib` of memory after a job is stopped and reaped before the answer, and a
fresh one is started in the background for the next request. A worker also exits when its pipe closes or
its parent (the server, or the fork server) goes away. The CLI, single-threaded, forks one worker per
command (`solve_blocking`).

Jobs travel pickled: the work is a module-level function, imported by name in the worker (tests replace
`plan_in_child` by another module-level function, which the workers forked from the test process find).

`SolvePool` puts a bounded queue in front of a bounded number of busy workers. A request that finds the
queue full, or that could not expect to start before its own deadline, is refused at once with a 503 and
`Retry-After`; a request that waits spends its own budget, and the solver gets what remains.

One exception to "nothing runs after its answer" (`SolvePool.finish_limit_s`): a `POST /plan` whose deadline
passes while its worker builds the candidate tables is answered 503 then, but the worker finishes the build
(at most `finish_limit_s` more, holding its slot) and goes back to the idle workers with the tables in its
memory and in the disk cache (fleetplan/solver/table_cache.py). Killed, the build would be lost, and a fleet
whose tables take longer to build than its time limit could never be planned: every retry would start it
over. The worker reports its stage through a shared flag (`Worker.stage`, set by `Deadline.enter`).
"""

import asyncio
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import anyio.to_thread

from fleetplan.models.errors import DeadlineExceeded, PlannerError, ServerBusy
from fleetplan.models.plan import Plan, PlanRequest

if TYPE_CHECKING:  # the parent never imports the solver stack (pandas, highspy): children do
    from fleetplan.models.store import ReplanRequest, Run
    from fleetplan.models.whatif import WhatIfRequest
    from fleetplan.profiler.store import ProfileStore
    from fleetplan.solver.deadline import Deadline

# solves run at a lower CPU priority than the server's event loop (GET /health, admission and answers
# stay responsive while every core solves). Not lower: on a machine shared with other work, nice 10
# starved solves (a 1-s plan ran past its 10-s limit at load average 8)
CHILD_NICENESS = 5
# the child stops its own work this long before the answer is due, to send it back in time
SEND_MARGIN_S = 0.1
# a child gets this long after its deadline before it is killed (it has usually ended by then)
KILL_SLACK_S = 0.0
# an idle worker checks this often whether its parent is still there
PARENT_CHECK_S = 1.0
# Worker.stage: what the worker's plan is doing now (Deadline.enter's CANDIDATES: building the tables)
OTHER, BUILDING = 0, 1
# jobs up to this size are written to the worker's pipe from the event loop; larger ones from a thread
INLINE_SEND_BYTES = 32 * 1024
# SolvePool.max_worker_rss_mib's default (a warm worker holds 85-130 MiB after S plans)
MAX_WORKER_RSS_MIB = 640.0
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

log = logging.getLogger("fleetplan.api")

_server_context: BaseContext | None = None


def server_context() -> BaseContext:
    """A fork server with the solver imported once, so every child starts warm and single-threaded."""
    global _server_context
    if _server_context is None:
        ctx = multiprocessing.get_context("forkserver")
        # fleetplan.api.warmup plans one small request in the fork server (its children start warm)
        ctx.set_forkserver_preload(["fleetplan.api.workers", "fleetplan.solver", "fleetplan.api.warmup"])
        _server_context = ctx
    return _server_context


def cli_context() -> BaseContext:
    """The CLI is single-threaded with the solver imported: a plain fork is the fastest start."""
    return multiprocessing.get_context("fork")


def plan_in_child(request: PlanRequest, store: "ProfileStore | None", deadline: "Deadline") -> Plan:
    """What a worker runs for POST /plan: solver.plan (tests replace it with a module-level function,
    under a fork context, to simulate hangs and bugs)."""
    from fleetplan import solver  # imported in the child: the CLI's parent never pays for it

    return solver.plan(request, store, deadline=deadline)


def whatif_in_child(request: "WhatIfRequest", store: "ProfileStore | None", deadline: "Deadline") -> Any:
    """POST /whatif's sweep in a worker (serially there: the worker is the unit that is killed at the
    deadline; each point's solve keeps its own time limit)."""
    from fleetplan.whatif import run_whatif

    return run_whatif(request, store=store)


def replan_in_child(
    database_url: str | None,
    run: "Run",
    order: "ReplanRequest",
    store: "ProfileStore | None",
    deadline: "Deadline",
) -> Any:
    """POST /fleets/{name}/replan's work in a worker, for the run the parent started (so that the parent
    can mark it failed if it kills the worker): its own connection to the store (none crosses a fork)."""
    from fleetplan.replan import replan
    from fleetplan.store import open_repository

    repository = open_repository(database_url, migrate=False)
    return replan(repository, run.fleet, order, profile_store=store, run=run)


def _serve(conn: multiprocessing.connection.Connection, stage: Any = None) -> None:
    """A worker's whole life: take a job `(work, args, at, budget_s)` from the pipe, answer it, take the
    next; end when the pipe closes or the process that started it is gone. `stage`: the shared flag its
    plans report their stage in (Worker.stage)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a worker stops
    os.nice(CHILD_NICENESS)  # the event loop (GET /health, admission, answers) goes first
    parent = os.getppid()  # the server, or the fork server: if it goes, so does this worker
    while True:
        while not conn.poll(PARENT_CHECK_S):
            if os.getppid() != parent:
                return
        try:
            job = conn.recv()
        except EOFError:
            return
        except Exception as error:  # noqa: BLE001 - a job that does not unpickle: a bug, answered as one
            conn.send(("crash", 0.0, f"the worker could not read its job: {type(error).__name__}: {error}"))
            continue
        answer = _perform(*job, stage=stage)
        try:
            conn.send(answer)
        except (TypeError, ValueError, AttributeError, pickle.PicklingError) as error:  # does not pickle
            conn.send(("crash", answer[1], f"the answer could not be sent: {type(error).__name__}: {error}"))


def _perform(
    work: Callable[..., Any], args: tuple[Any, ...], at: float, budget_s: float, stage: Any = None
) -> tuple[Any, ...]:
    """`work(*args, deadline)` as the answer to send: ("ok", seconds, result), ("error", seconds, class,
    message, field) for a PlannerError, ("crash", seconds, text) for anything else (a bug). The deadline
    reports each stage the work enters in `stage` (when given)."""
    from fleetplan.solver.deadline import Deadline  # the parent never imports the solver package

    report = None if stage is None else partial(_report, stage)
    deadline = Deadline(at - SEND_MARGIN_S, budget_s, on_stage=report)
    began = time.perf_counter()
    try:
        result = work(*args, deadline)
    except PlannerError as error:
        return ("error", time.perf_counter() - began, type(error), error.message, error.field)
    except Exception as error:  # noqa: BLE001 - a bug: reported to the parent, which logs it as a 500
        return ("crash", time.perf_counter() - began, f"{type(error).__name__}: {error}")
    finally:
        if stage is not None:
            stage.value = OTHER
    return ("ok", time.perf_counter() - began, result)


def _report(stage: Any, name: str) -> None:
    from fleetplan.solver.deadline import CANDIDATES

    stage.value = BUILDING if name == CANDIDATES else OTHER


def _rebuild(cls: type[PlannerError], message: str, field_: str | None) -> PlannerError:
    """The child's PlannerError, re-made in the parent (subclasses may have other constructors)."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.message, error.field = message, field_
    return error


class _Building(Exception):  # noqa: N818 - a hand-over, not an error: the worker finishes its build
    """Raised inside SolvePool._solve at the deadline of a worker that is building candidate tables."""

    def __init__(self, worker: "Worker") -> None:
        super().__init__("building candidate tables")
        self.worker = worker


class WorkerCrashed(RuntimeError):
    """A worker died without an answer, or its work raised an unexpected error: a planner bug (500)."""


class Solved(NamedTuple):
    """A worker's answer: what the work returned, and how long the work itself took in the worker."""

    result: Any
    work_s: float


def _result(payload: tuple[Any, ...]) -> Solved:
    kind, work_s = payload[:2]
    if kind == "ok":
        return Solved(payload[2], work_s)
    if kind == "error":
        raise _rebuild(*payload[2:])
    raise WorkerCrashed(payload[2])


def _timed_out(request: PlanRequest) -> DeadlineExceeded:
    msg = (
        f"no plan within time_limit_s={request.options.time_limit_s:g}; the work was stopped. "
        "Raise time_limit_s or shrink the request"
    )
    return DeadlineExceeded(msg, field="options.time_limit_s")


@dataclass(eq=False)
class Worker:
    """One worker process and the parent's end of its pipe (both ways: jobs out, answers back)."""

    process: Any
    conn: multiprocessing.connection.Connection
    stage: Any = None  # a shared int: BUILDING while its plan builds candidate tables, else OTHER

    @classmethod
    def start(cls, ctx: BaseContext) -> "Worker":
        mine, theirs = ctx.Pipe(duplex=True)
        stage = ctx.RawValue("i", OTHER)  # type: ignore[attr-defined]
        process = ctx.Process(target=_serve, args=(theirs, stage), daemon=True)  # type: ignore[attr-defined]
        process.start()
        theirs.close()  # the worker's end: once it exits, `mine` sees EOF
        return cls(process, mine, stage)

    def building(self) -> bool:
        """Whether the worker's plan is building candidate tables now."""
        return self.stage is not None and self.stage.value == BUILDING

    def job(self, work: Callable[..., Any], args: tuple[Any, ...], at: float, budget_s: float) -> bytes:
        """The pickled job (functions travel by module and name: they must be importable)."""
        return bytes(ForkingPickler.dumps((work, args, at, budget_s)))

    def send(self, job: bytes) -> None:
        try:
            self.conn.send_bytes(job)
        except OSError as error:
            msg = f"the worker process could not take the work ({error})"
            raise WorkerCrashed(msg) from None

    def receive(self) -> Solved:
        """The answer to the job sent; raises the work's PlannerError, or WorkerCrashed."""
        try:
            payload = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(1.0)  # it is dying: its exit code says how
            code = self.process.exitcode
            msg = f"the worker process exited without an answer (exit code {code})"
            raise WorkerCrashed(msg) from None
        return _result(payload)

    def stop(self) -> None:
        """Kill the worker (if it still runs) and reap it; idempotent."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()

    def rss_bytes(self) -> int | None:
        """Resident memory, from /proc; None where there is none."""
        try:
            resident = int(Path(f"/proc/{self.process.pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return None
        return resident * PAGE_BYTES


def solve_blocking(
    request: PlanRequest, store: "ProfileStore | None", deadline_at: float, ctx: BaseContext | None = None
) -> Plan:
    """Plan in a worker of its own; at `deadline_at` (time.monotonic()) kill it and raise DeadlineExceeded
    (saying so when it was still building the candidate tables). The CLI's way (it blocks, and plans once)."""
    worker = Worker.start(ctx or cli_context())
    try:
        worker.send(worker.job(plan_in_child, (request, store), deadline_at, request.options.time_limit_s))
        if not worker.conn.poll(max(deadline_at + KILL_SLACK_S - time.monotonic(), 0)):
            raise _built_too_long(request) if worker.building() else _timed_out(request)
        return worker.receive().result  # type: ignore[no-any-return]
    finally:
        worker.stop()


def _built_too_long(request: PlanRequest) -> DeadlineExceeded:
    from fleetplan.solver import table_cache  # the CLI's parent has the solver imported

    kept = (
        "the tables are then kept on disk for every later plan of this fleet (`fleetplan cache`)"
        if table_cache.directory() is not None
        else "with FLEETPLAN_CANDIDATE_CACHE on, the tables would then be kept for every later plan"
    )
    stopped = "and the build was stopped. Plan once with a larger time limit"
    msg = f"{_build_outlasts(request.options.time_limit_s)}, {stopped}: {kept}"
    return DeadlineExceeded(msg, field="options.time_limit_s")


def _build_outlasts(budget_s: float) -> str:
    """The first clause of a request's 503 whose candidate tables were still being built at its deadline
    (the CLI's, which stops the build, and the server's, which lets it finish)."""
    return f"no plan within time_limit_s={budget_s:g}: building this fleet's candidate tables takes longer"


@dataclass
class SolvePool:
    """At most `slots` workers busy at once and `queue` requests waiting for one (the rest: 503); idle
    workers wait, warm, for the next request."""

    slots: int
    queue: int
    context: Callable[[], BaseContext] = server_context
    running: int = 0
    waiting: int = 0
    rejected: int = 0
    # recent solve durations (seconds): the admission estimate of how long a queued request waits
    mean_solve_s: float = 1.0
    # Retry-After never asks for more (fleetplan/api/server.py keeps idle connections open longer)
    max_retry_after_s: int = 20
    # a worker holding more resident memory than this after a job is replaced (a large request's arrays
    # stay in the allocator's arenas); a warm worker holds 85-130 MiB (S), a 5,000-class plan about 1 GiB
    max_worker_rss_mib: float = MAX_WORKER_RSS_MIB
    # a POST /plan whose deadline passes while its worker builds candidate tables: the worker may finish the
    # build this much longer, holding its slot, so that the tables are kept (0: killed at the deadline); at
    # most half the slots (at least one) finish builds at once (_may_finish)
    finish_limit_s: float = 60.0
    finishing: int = 0  # workers finishing a build now
    _slots: anyio.Semaphore | None = None
    _children: set[Worker] = field(default_factory=set)  # workers doing a request's work now
    _idle: list[Worker] = field(default_factory=list)  # warm workers waiting for work
    _lock: threading.Lock = field(default_factory=threading.Lock)  # _idle and closed, across threads
    _waiters: set[anyio.CancelScope] = field(default_factory=set)
    _finishers: set[asyncio.Task[None]] = field(default_factory=set)
    closed: bool = False
    replaced: int = 0  # workers started to replace one killed, crashed or grown too large

    def _semaphore(self) -> anyio.Semaphore:
        if self._slots is None:  # made in the running event loop
            self._slots = anyio.Semaphore(self.slots)
        return self._slots

    def queued(self) -> int:
        """Requests that hold no slot yet and will not get a free one at once: the queue proper. (A
        request that was admitted to a free slot counts as waiting until its task acquires it.)"""
        return max(self.running + self.waiting - self.slots, 0)

    def retry_after_s(self) -> int:
        """Seconds until a slot may be free: the queue ahead divided over the slots, times a solve; never
        more than `max_retry_after_s` (the server keeps an idle connection open longer than that)."""
        ahead = self.queued()
        estimate = max(1, math.ceil(self.mean_solve_s * (1 + ahead / self.slots)))
        return min(estimate, self.max_retry_after_s)

    def admit(self, budget_s: float, deadline_at: float) -> None:
        """Refuse at once (ServerBusy, 503 + Retry-After) when the queue is full or the wait expected
        ahead would leave the request no time of its own."""
        if self.closed:
            self._reject("the server is shutting down")
        # running + waiting, not running alone: a burst of requests is admitted before the first of them
        # has acquired its slot, and each must see the ones admitted before it
        if self.running + self.waiting < self.slots:
            return
        queued = self.queued()
        if queued >= self.queue:
            self._reject(f"all {self.slots} solver slots are busy and {queued} requests are queued")
        expected_wait = self.mean_solve_s * (queued + 1) / self.slots
        if expected_wait >= 0.5 * (deadline_at - time.monotonic()):
            self._reject(
                f"all {self.slots} solver slots are busy; the expected wait ({expected_wait:.1f} s) would "
                f"use most of the request's {budget_s:g} s"
            )

    def _reject(self, why: str) -> None:
        self.rejected += 1
        retry = self.retry_after_s()
        raise ServerBusy(f"{why}; retry after {retry} s", retry_after_s=retry)

    async def run(self, request: PlanRequest, store: "ProfileStore | None", deadline_at: float) -> Solved:
        """Plan `request` in a worker by `deadline_at`; cancelling the caller (client gone, shutdown) kills
        the worker. The Plan, and the seconds plan() took in the worker."""
        budget, timed_out = request.options.time_limit_s, _timed_out(request)
        job = (plan_in_child, (request, store), deadline_at, budget, timed_out)
        return await self.solve(*job, finish_building=True)

    async def call(self, *job: Any) -> Any:
        """What `solve(*job)` answers, without its time."""
        return (await self.solve(*job)).result

    async def solve(
        self,
        work: Callable[..., Any],
        args: tuple[Any, ...],
        deadline_at: float,
        budget_s: float,
        timed_out: PlannerError,
        *,
        finish_building: bool = False,
    ) -> Solved:
        """`work(*args, deadline)` in a worker holding one of the slots, by `deadline_at` (then the worker is
        killed and `timed_out` raised); cancelling the caller (client gone, shutdown) kills the worker.
        `work` (and `args`) travel pickled: a module-level function, which the worker imports by name.
        `finish_building`: a worker building candidate tables at the deadline finishes them (`_finish`)."""
        self.admit(budget_s, deadline_at)
        slots = self._semaphore()
        self.waiting += 1
        acquired = False
        try:
            with anyio.move_on_at(deadline_at) as waiting:
                self._waiters.add(waiting)
                await slots.acquire()
                acquired = True
        finally:
            self.waiting -= 1
            self._waiters.discard(waiting)
        if not acquired:  # shutting down, or the budget went by in the queue (admit() estimates the wait)
            if self.closed:
                self._reject("the server is shutting down")
            self._reject(f"no solver slot freed within the request's {budget_s:g} s")
        self.running += 1
        began = time.monotonic()
        handed = False  # to a finishing task, which then frees the slot
        try:
            job = (work, args, deadline_at, budget_s)
            return await self._solve(job, deadline_at, timed_out, finish_building)
        except _Building as building:
            handed = self._finish_later(building.worker)
            if not handed:
                raise timed_out from None
            raise self._still_building(budget_s) from None
        finally:
            if not handed:
                self._done(began)

    def _done(self, began: float | None) -> None:
        """A job's slot is free again; its time since `began` joins the admission estimate (None: it does
        not, as a build finished past its request's deadline is no request's wait)."""
        self.running -= 1
        self._semaphore().release()
        if began is not None:
            self.mean_solve_s = 0.8 * self.mean_solve_s + 0.2 * (time.monotonic() - began)

    async def _solve(
        self, job: tuple[Any, ...], deadline_at: float, timed_out: PlannerError, finish_building: bool = False
    ) -> Solved:
        """One job on a warm worker; the worker goes back to the idle ones if it answered, and is killed
        (and replaced in the background) if it did not: at the deadline, on cancellation, on a crash. With
        `finish_building`, a worker building candidate tables at the deadline is handed on (_Building)."""
        worker = await self._take()
        self._children.add(worker)
        answered = handed = False
        try:
            # pickled in a thread: a request with ~8 MB of inline profile rows takes ~120 ms, which on the
            # event loop would hold every other request (/health among them) that long
            await self._send(worker, await anyio.to_thread.run_sync(worker.job, *job))
            with anyio.move_on_at(deadline_at + KILL_SLACK_S):
                await anyio.wait_readable(worker.conn.fileno())
                try:
                    solved = await anyio.to_thread.run_sync(worker.receive)
                except PlannerError:
                    answered = True
                    raise
                except WorkerCrashed:
                    if self.closed:  # killed by the shutdown, not a bug
                        self._reject("the server shut down before the work was done")
                    raise
                answered = True
                return solved
            if finish_building and worker.building() and self._may_finish():
                handed = True
                raise _Building(worker)
            raise timed_out
        finally:
            if not handed:
                with anyio.CancelScope(shield=True):
                    await self._release(worker, answered)
                # only now: until its release is done a worker stays where kill_all finds it (a SIGTERM's end
                # of grace cancels this task, and the loop could end before the release's thread had stopped
                # it: a sweep's worker ran on at 100% CPU after the server had exited)
                self._children.discard(worker)

    def _may_finish(self) -> bool:
        """Whether one more worker may finish its build past its deadline: at most half the slots (at least
        one) at once, so that a stream of requests whose builds outlast their limits cannot hold them all."""
        return self.finish_limit_s > 0 and not self.closed and self.finishing < max(1, self.slots // 2)

    def _still_building(self, budget_s: float) -> DeadlineExceeded:
        """The 503 of a request whose candidate tables are still being built (Retry-After: the request's
        time limit, within the cap: a guess, as the build's own end is not known)."""
        retry = min(max(1, math.ceil(budget_s)), self.max_retry_after_s)
        msg = (
            f"{_build_outlasts(budget_s)}. The build goes on and its tables are kept: a retry once it has "
            "ended plans from them (or raise time_limit_s)"
        )
        error = DeadlineExceeded(msg, field="options.time_limit_s")
        error.retry_after_s = retry  # type: ignore[attr-defined]
        return error

    def _finish_later(self, worker: Worker) -> bool:
        """Let `worker` finish its build in a task of the event loop that holds the slot until then; False
        (the worker stopped instead) where no task can be made (an event loop other than asyncio's)."""
        try:
            task = asyncio.get_running_loop().create_task(self._finish(worker))
        except RuntimeError:
            log.warning("a candidate build could not be left to finish: no asyncio loop")
            worker.stop()
            self._children.discard(worker)
            self._replace()
            return False
        self.finishing += 1
        self._finishers.add(task)  # kept referenced until it ends
        task.add_done_callback(self._finishers.discard)
        return True

    async def _finish(self, worker: Worker) -> None:
        """Wait (at most finish_limit_s) for the worker to end its job: past its deadline, the plan stops
        right after the build with DeadlineExceeded, an answer, and the worker goes back to the idle ones
        with the tables; one that does not answer in time (or crashes) is killed and replaced. The slot is
        freed after."""
        answered = False
        try:
            with anyio.move_on_after(self.finish_limit_s):
                await anyio.wait_readable(worker.conn.fileno())
                try:
                    await anyio.to_thread.run_sync(worker.receive)
                except PlannerError:
                    pass  # the deadline's own error: an answer
                except WorkerCrashed:
                    return
                answered = True
        finally:
            with anyio.CancelScope(shield=True):
                await self._release(worker, answered)
            self._children.discard(worker)
            self.finishing -= 1
            self._done(None)

    async def _send(self, worker: Worker, job: bytes) -> None:
        """A small job is written at once (an idle worker's socket buffer is empty and far larger); a large
        one from a thread, which the worker's reading unblocks."""
        if len(job) <= INLINE_SEND_BYTES:
            worker.send(job)
        else:
            await anyio.to_thread.run_sync(worker.send, job)

    async def _take(self) -> Worker:
        """An idle warm worker, or (none idle: the replacements are still starting) a new one now. Shielded:
        a worker started is always handed to the caller, which releases it."""
        with anyio.CancelScope(shield=True):
            while True:
                with self._lock:
                    worker = self._idle.pop() if self._idle else None
                if worker is None:
                    return await anyio.to_thread.run_sync(Worker.start, self.context())
                if worker.process.is_alive():
                    return worker
                await anyio.to_thread.run_sync(worker.stop)  # died while idle (e.g. the OOM killer)
                self._replace()

    async def _release(self, worker: Worker, answered: bool) -> None:
        """Back to the idle workers if it answered and is not too large; else kill it, replace it."""
        rss = worker.rss_bytes() if answered else None
        if answered and (rss is None or rss <= self.max_worker_rss_mib * 2**20) and self._park(worker):
            return
        await anyio.to_thread.run_sync(worker.stop)
        self._replace()

    def _park(self, worker: Worker) -> bool:
        """Keep `worker` idle (False: the pool is closed or has enough idle workers; the caller stops it)."""
        with self._lock:
            if self.closed or len(self._idle) >= self.slots:
                return False
            self._idle.append(worker)
            return True

    def _replace(self) -> None:
        """Start a worker in the background (a thread), so that no request waits for its start."""
        if not self.closed:
            self.replaced += 1
            threading.Thread(target=self._start_idle, name="fleetplan-worker-start", daemon=True).start()

    def _start_idle(self) -> None:
        try:
            worker = Worker.start(self.context())
        except Exception:  # a request that finds no idle worker starts one itself
            log.exception("could not start a solve worker")
            return
        if not self._park(worker):
            worker.stop()

    def warm(self) -> None:
        """Start the fork server (it imports the solver and plans once) and `slots` idle workers, so the
        first requests pay nothing."""
        for _ in range(self.slots - len(self._idle)):
            self._start_idle()

    def drain(self) -> None:
        """Shutdown has begun (call in the event loop): refuse new work, answer every waiting request
        503 now; running solves go on until the grace period ends or they finish."""
        self.closed = True
        for waiting in list(self._waiters):
            waiting.cancel()

    def kill_all(self) -> None:
        """Shutdown: refuse new work, kill every worker; running solves end now (their requests answer
        503, and their tasks reap their workers)."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()
        for worker in list(self._children):
            if worker.process.is_alive():
                worker.process.kill()


__all__ = [
    "SolvePool",
    "Solved",
    "WorkerCrashed",
    "cli_context",
    "replan_in_child",
    "server_context",
    "solve_blocking",
    "whatif_in_child",
]
