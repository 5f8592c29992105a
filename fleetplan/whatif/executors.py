"""Where the points run, behind one interface: in this process, in local worker processes, or on a Dask
cluster. Each runs `fn(ctx, chunk)` for every chunk of point indices and reports finished points.
"""

import multiprocessing
import os
import queue
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fleetplan.models.errors import InputError

Task = Callable[..., Any]  # fn(ctx, chunk[, done]): done(1) after each point, where given
Progress = Callable[[int], None]


class Executor(Protocol):
    """Runs every chunk; calls `done(n)` as each chunk of n points finishes; results in chunk order."""

    name: str
    workers: int

    def run(self, fn: Task, ctx: Any, chunks: list[list[int]], done: Progress) -> list[Any]: ...


@dataclass
class Serial:
    """Every chunk in this process, one after the other, reporting every point as it finishes."""

    name: str = "serial"
    workers: int = 1

    def run(self, fn: Task, ctx: Any, chunks: list[list[int]], done: Progress) -> list[Any]:
        return [fn(ctx, chunk, done) for chunk in chunks]


_CONTEXT: dict[str, Any] = {}


def _remember(ctx: Any, ticks: Any) -> None:
    _CONTEXT["ctx"], _CONTEXT["ticks"] = ctx, ticks


def _run_remembered(fn: Task, chunk: list[int]) -> Any:
    return fn(_CONTEXT["ctx"], chunk, _CONTEXT["ticks"].put)


TICK_S = 0.2  # how often the parent passes the workers' finished points on to `done`


@dataclass
class LocalProcesses:
    """A pool of `workers` processes; the sweep context goes to each worker once, at its start. Each worker
    reports every point it finishes through a queue, so the progress bar moves point by point (it moved by
    whole chunks, ~37 points at a time on a 220-point grid, its ETA swinging 9 -> 19 -> 12 -> 5 s)."""

    workers: int
    name: str = "processes"

    def run(self, fn: Task, ctx: Any, chunks: list[list[int]], done: Progress) -> list[Any]:
        context = multiprocessing.get_context()
        ticks = context.Queue()
        total, told = sum(map(len, chunks)), 0

        def tell(n: int) -> None:
            nonlocal told
            n = min(n, total - told)  # never past the total, whatever the queue still holds
            if n > 0:
                told += n
                done(n)

        with ProcessPoolExecutor(
            self.workers, mp_context=context, initializer=_remember, initargs=(ctx, ticks)
        ) as pool:
            futures = {pool.submit(_run_remembered, fn, chunk): i for i, chunk in enumerate(chunks)}
            results: list[Any] = [None] * len(chunks)
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=TICK_S, return_when=FIRST_COMPLETED)
                tell(_drained(ticks))
                for future in finished:
                    results[futures[future]] = future.result()
        tell(_drained(ticks))
        tell(total - told)  # a tick lost with a worker still counts its points once
        ticks.close()
        return results


def _drained(ticks: Any) -> int:
    """The points reported in `ticks` so far (without waiting)."""
    n = 0
    while True:
        try:
            n += ticks.get_nowait()
        except queue.Empty:
            return n


@dataclass
class DaskCluster:
    """Chunks as tasks on a Dask cluster (`distributed.Client`): the context is scattered to every worker
    once. Give a running `client`, or the scheduler `address` (tcp://HOST:PORT) to connect to; that
    connection is opened when first needed (the worker count, which sizes the chunks, or run) and closed
    at the end of run."""

    address: str | None = None
    client: Any = None
    name: str = "dask"
    _own: Any = field(default=None, repr=False)
    _workers: int | None = field(default=None, repr=False)

    @property
    def workers(self) -> int:
        """The cluster's threads (asked once)."""
        if self._workers is None:
            self._workers = sum(self._client().nthreads().values())
        return self._workers

    def _client(self) -> Any:
        if self.client is not None:
            return self.client
        if self._own is None:
            try:
                self._own = _distributed().Client(self.address, timeout="10s")
            except (OSError, TimeoutError) as error:  # unreachable, refused, or not a scheduler
                msg = f"cannot reach the Dask scheduler at {self.address}: {error}"
                raise InputError(msg, field="scheduler") from error
        return self._own

    def run(self, fn: Task, ctx: Any, chunks: list[list[int]], done: Progress) -> list[Any]:
        distributed = _distributed()
        client = self._client()
        try:
            _ = self.workers
            shared = client.scatter(ctx, broadcast=True)
            futures = client.map(fn, [shared] * len(chunks), chunks, pure=False)
            order = {future.key: i for i, future in enumerate(futures)}
            results: list[Any] = [None] * len(chunks)
            for future in distributed.as_completed(futures):
                index = order[future.key]
                results[index] = future.result()
                done(len(chunks[index]))
            return results
        finally:
            if self._own is not None:
                self._own.close()
                self._own = None


def _distributed() -> Any:
    try:
        import distributed
    except ImportError as error:
        msg = "a Dask scheduler needs dask.distributed: pip install 'fleetplan[dask]'"
        raise InputError(msg, field="scheduler") from error
    return distributed


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def make_executor(workers: int | None = None, scheduler: str | None = None) -> Executor:
    """Dask at `scheduler`, else local processes (`workers`, default the CPU count; 1 runs in-process)."""
    if scheduler is not None:
        if workers is not None:
            raise InputError("give either workers or a scheduler, not both", field="workers")
        return DaskCluster(address=scheduler)
    n = default_workers() if workers is None else workers
    if n < 1:
        raise InputError(f"must be >= 1, got {n}", field="workers")
    return Serial() if n == 1 else LocalProcesses(n)


def chunks_of(
    indices: list[int], tasks: int, budget_of: Callable[[int], float] | None = None
) -> list[list[int]]:
    """At most `tasks` contiguous chunks of `indices` (in the order given) of about equal weight, the chunk
    with the highest budget first. A point weighs 1 plus its budget (`budget_of(index)`, 0 when not
    given): on paper.json a point's solve takes about time proportional to its budget (0.1 s at 3 $/h,
    1-2 s from 12 $/h up), so equal counts left the top chunk with most of the work. Contiguous, since a
    task's plan answers its lower neighbours down to its cost (point.solve_chunk); the costliest chunks
    start first, so that the workers finish together."""
    top = budget_of or (lambda _i: 0.0)
    weight = 1.0 + np.maximum([top(i) for i in indices], 0.0)
    middle = np.cumsum(weight) - weight / 2  # each point goes to the chunk its weight's middle falls in
    which = np.minimum((middle * tasks / weight.sum()).astype(int), max(tasks, 1) - 1)
    chunks = [[indices[j] for j in np.flatnonzero(which == t)] for t in range(max(tasks, 1))]
    chunks = [chunk for chunk in chunks if chunk]
    return sorted(chunks, key=lambda chunk: -max(top(i) for i in chunk))
