"""Solves in worker processes that can be stopped: the bound behind `options.time_limit_s`.

A thread running HiGHS or a pandas merge cannot be interrupted, so a solve runs in a child process of its
own: `solver.plan` gets the request's deadline (checked between stages, and capping the solver's time
limit), and the parent kills the child when the deadline passes, when the client disconnects, or when the
server shuts down. Nothing of a request runs after its answer.

The HTTP service starts children from a fork server that has the solver imported (a child starts in
milliseconds, and never inherits the event loop's threads); the CLI, single-threaded, forks directly.

`SolvePool` puts a bounded queue in front of a bounded number of running solves. A request that finds the
queue full, or that could not expect to start before its own deadline, is refused at once with a 503 and
`Retry-After`; a request that waits spends its own budget, and the solver gets what remains.
"""

import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any

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
    """What a child runs: solver.plan, looked up when called (tests replace it, under a fork context, to
    simulate hangs and bugs)."""
    from fleetplan import solver  # imported in the child: the CLI's parent never pays for it

    return solver.plan(request, store, deadline=deadline)


def whatif_in_child(request: "WhatIfRequest", store: "ProfileStore | None", deadline: "Deadline") -> Any:
    """POST /whatif's sweep in a child (serially there: the child is the unit that is killed at the
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
    """POST /fleets/{name}/replan's work in a child, for the run the parent started (so that the parent
    can mark it failed if it kills the child): its own connection to the store (none crosses a fork)."""
    from fleetplan.replan import replan
    from fleetplan.store import open_repository

    repository = open_repository(database_url, migrate=False)
    return replan(repository, run.fleet, order, profile_store=store, run=run)


def _child(
    conn: multiprocessing.connection.Connection,
    work: Callable[..., Any],
    args: tuple[Any, ...],
    at: float,
    budget_s: float,
) -> None:
    """The child's whole life: `work(*args, deadline)`, send ("ok", result) or ("error", class, message,
    field), exit."""
    from fleetplan.solver.deadline import Deadline

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a child stops
    os.nice(CHILD_NICENESS)  # the event loop (GET /health, admission, answers) goes first
    deadline = Deadline(at - SEND_MARGIN_S, budget_s)
    try:
        payload: tuple[Any, ...] = ("ok", work(*args, deadline))
    except PlannerError as error:
        payload = ("error", type(error), error.message, error.field)
    except Exception as error:  # noqa: BLE001 - a bug: reported to the parent, which logs it as a 500
        payload = ("crash", f"{type(error).__name__}: {error}")
    try:
        conn.send(payload)
    finally:
        conn.close()


def _noop() -> None:
    """A child that only proves the fork server is up."""


def _rebuild(cls: type[PlannerError], message: str, field_: str | None) -> PlannerError:
    """The child's PlannerError, re-made in the parent (subclasses may have other constructors)."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.message, error.field = message, field_
    return error


class WorkerCrashed(RuntimeError):
    """A child died without an answer, or raised an unexpected error: a planner bug (500)."""


def _result(payload: tuple[Any, ...]) -> Any:
    kind = payload[0]
    if kind == "ok":
        return payload[1]
    if kind == "error":
        raise _rebuild(*payload[1:])
    raise WorkerCrashed(payload[1])


def _timed_out(request: PlanRequest) -> DeadlineExceeded:
    msg = (
        f"no plan within time_limit_s={request.options.time_limit_s:g}; the work was stopped. "
        "Raise time_limit_s or shrink the request"
    )
    return DeadlineExceeded(msg, field="options.time_limit_s")


@dataclass(eq=False)
class Child:
    """One running child and the parent's end of its pipe."""

    process: Any
    conn: multiprocessing.connection.Connection

    @classmethod
    def start(
        cls, ctx: BaseContext, work: Callable[..., Any], args: tuple[Any, ...], at: float, budget_s: float
    ) -> "Child":
        receive, send = ctx.Pipe(duplex=False)
        process = ctx.Process(target=_child, args=(send, work, args, at, budget_s), daemon=True)  # type: ignore[attr-defined]
        process.start()
        send.close()  # the child's end: once it exits, receive sees EOF
        return cls(process, receive)

    def stop(self) -> None:
        """Kill the child (if it still runs) and reap it; idempotent."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()

    def receive(self) -> Any:
        try:
            payload = self.conn.recv()
        except EOFError:
            code = self.process.exitcode
            msg = f"the worker process exited without an answer (exit code {code})"
            raise WorkerCrashed(msg) from None
        return _result(payload)


def solve_blocking(
    request: PlanRequest, store: "ProfileStore | None", deadline_at: float, ctx: BaseContext | None = None
) -> Plan:
    """Plan in a child process; at `deadline_at` (time.monotonic()) kill it and raise DeadlineExceeded.
    The CLI's way (it blocks)."""
    child = Child.start(
        ctx or cli_context(), plan_in_child, (request, store), deadline_at, request.options.time_limit_s
    )
    try:
        if not child.conn.poll(max(deadline_at + KILL_SLACK_S - time.monotonic(), 0)):
            raise _timed_out(request)
        return child.receive()  # type: ignore[no-any-return]
    finally:
        child.stop()


@dataclass
class SolvePool:
    """At most `slots` children solving at once and `queue` requests waiting for one (the rest: 503)."""

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
    _slots: anyio.Semaphore | None = None
    _children: set[Child] = field(default_factory=set)
    _waiters: set[anyio.CancelScope] = field(default_factory=set)
    closed: bool = False

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

    async def run(self, request: PlanRequest, store: "ProfileStore | None", deadline_at: float) -> Plan:
        """Plan `request` in a child by `deadline_at`; cancelling the caller (client gone, shutdown) kills
        the child."""
        budget, timed_out = request.options.time_limit_s, _timed_out(request)
        plan: Plan = await self.call(plan_in_child, (request, store), deadline_at, budget, timed_out)
        return plan

    async def call(
        self,
        work: Callable[..., Any],
        args: tuple[Any, ...],
        deadline_at: float,
        budget_s: float,
        timed_out: PlannerError,
    ) -> Any:
        """`work(*args, deadline)` in a child holding one of the slots, by `deadline_at` (then the child is
        killed and `timed_out` raised); cancelling the caller (client gone, shutdown) kills the child.
        `work` must be importable by name (module level) for the fork server to find it."""
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
        try:
            return await self._solve(Child.start, (work, args, deadline_at, budget_s), deadline_at, timed_out)
        finally:
            self.running -= 1
            slots.release()
            self.mean_solve_s = 0.8 * self.mean_solve_s + 0.2 * (time.monotonic() - began)

    async def _solve(
        self,
        start: Callable[..., Child],
        start_args: tuple[Any, ...],
        deadline_at: float,
        timed_out: PlannerError,
    ) -> Any:
        child = await anyio.to_thread.run_sync(start, self.context(), *start_args)
        self._children.add(child)
        try:
            with anyio.move_on_at(deadline_at + KILL_SLACK_S):
                await anyio.wait_readable(child.conn.fileno())
                try:
                    return await anyio.to_thread.run_sync(child.receive)
                except WorkerCrashed:
                    if self.closed:  # killed by the shutdown, not a bug
                        self._reject("the server shut down before the work was done")
                    raise
            raise timed_out
        finally:
            self._children.discard(child)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(child.stop)

    def warm(self) -> None:
        """Start the fork server (it imports the solver) and one child, so the first request pays nothing."""
        process = self.context().Process(target=_noop, daemon=True)  # type: ignore[attr-defined]
        process.start()
        process.join()

    def drain(self) -> None:
        """Shutdown has begun (call in the event loop): refuse new work, answer every waiting request
        503 now; running solves go on until the grace period ends or they finish."""
        self.closed = True
        for waiting in list(self._waiters):
            waiting.cancel()

    def kill_all(self) -> None:
        """Shutdown: refuse new work and kill every running child (their requests answer 503)."""
        self.closed = True
        for child in list(self._children):
            if child.process.is_alive():
                child.process.kill()


__all__ = [
    "SolvePool",
    "WorkerCrashed",
    "cli_context",
    "replan_in_child",
    "server_context",
    "solve_blocking",
    "whatif_in_child",
]
