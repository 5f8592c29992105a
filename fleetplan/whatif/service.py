"""run_whatif(request) -> WhatIfResult: the one service function the API and the CLI call, and the CSV."""

import csv
import io
import time
from collections.abc import Callable

from fleetplan.models.whatif import Point, WhatIfRequest, WhatIfResult, WhatIfSolver
from fleetplan.profiler.store import ProfileStore
from fleetplan.solver.formulation import spends_all
from fleetplan.solver.pipeline import resolve_profiles
from fleetplan.whatif.executors import Executor, Serial, chunks_of
from fleetplan.whatif.frontier import frontier
from fleetplan.whatif.grid import grid, variant
from fleetplan.whatif.point import SweepContext, budget_key, make_context, solve_chunk

# chunks per worker: more balance the load, fewer keep more plans together for reuse. Measured with 2
# processes (bench/README.md, session 24): paper.json's 100-point budget sweep 8.2 -> 6.9 s at 3 (the same
# 30 solves: below the fleet's cost a plan rarely answers the next grid point, so a chunk's first point is
# a solve either way), its count sweep 6.6 -> 6.9 s (35 solves instead of 32: plans answer many counts)
CHUNKS_PER_WORKER = 3


def run_whatif(
    request: WhatIfRequest,
    executor: Executor | None = None,
    *,
    store: ProfileStore | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> WhatIfResult:
    """Plan every grid point of `request` on `executor` (default: in this process).

    `progress(done, total)` is called as points finish. Raises the planner's errors (InputError,
    ProfileMissing, SolverFailure) like solver.plan.
    """
    began = time.perf_counter()
    executor = executor or Serial()
    coords = grid(request)
    table = resolve_profiles(request.base, store)
    ctx = make_context(request, coords, table)
    finished = [0]

    def done(n: int) -> None:
        finished[0] += n
        if progress is not None:
            progress(finished[0], len(coords))

    if progress is not None:
        progress(0, len(coords))
    tasks = max(1, executor.workers) * CHUNKS_PER_WORKER if executor.name != "serial" else 1
    results = executor.run(solve_chunk, ctx, task_chunks(ctx, tasks), done)
    points: list[Point | None] = [None] * len(coords)
    counts = {"built": int(ctx.shared is not None), "solves": 0, "reused": 0, "screened": 0}
    for pairs, stats in results:
        for index, point in pairs:
            points[index] = point
        for key in counts:
            counts[key] += stats[key]
    final = [p for p in points if p is not None]
    return WhatIfResult(
        axes=[axis.param for axis in request.axes],
        points=final,
        frontier=frontier(final),
        solver=WhatIfSolver(
            backend=request.base.options.solver,
            executor=executor.name,  # type: ignore[arg-type]
            workers=executor.workers,
            candidates_built=counts["built"],
            solves=counts["solves"],
            reused=counts["reused"],
            screened=counts["screened"],
        ),
        wall_ms=round((time.perf_counter() - began) * 1e3, 3),
    )


def task_chunks(ctx: SweepContext, tasks: int) -> list[list[int]]:
    """The executor's chunks: the points whose budget is at least their fleet's cost (whose models are one,
    the budget rows at that cost: formulation.budget_row), one chunk per request but for the budget (one
    solve answers them all, and one per device type their marginal values), then the others sorted by
    their other coordinates and then budget and cut into `tasks` contiguous chunks (executors.chunks_of),
    the highest budget first."""
    budget = [c.get("budget_per_hour", 0.0) for c in ctx.coords]
    unbound: dict[bytes, list[int]] = {}
    rest = []
    for i, coords in enumerate(ctx.coords):
        request = variant(ctx.request.base, coords) if "budget_per_hour" in coords else None
        if request is not None and spends_all(request, budget[i]):
            unbound.setdefault(budget_key(request)[0], []).append(i)
        else:
            rest.append(i)
    rest.sort(key=lambda i: ([v for k, v in ctx.coords[i].items() if k != "budget_per_hour"], budget[i]))
    return [*unbound.values(), *(chunks_of(rest, tasks, budget.__getitem__) if rest else [])]


def to_csv(result: WhatIfResult) -> str:
    """One row per point: the coordinates, the plan, devices, bought and marginal RPS per type, both
    baselines, the binding limits (";"-separated) and whether the point is on the frontier."""
    names = list(result.points[0].devices) if result.points else []
    header = [
        *result.axes,
        "status",
        "slo_rps",
        "demand_rps",
        "cost_per_hour",
        "mip_gap",
        *(f"devices:{n}" for n in names),
        *(f"bought:{n}" for n in names),
        *(f"marginal_rps:{n}" for n in names),
        "gpu_only_rps",
        "gpu_only_cost_per_hour",
        "greedy_rps",
        "greedy_cost_per_hour",
        "binding",
        "frontier",
    ]
    on_frontier = set(result.frontier)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for index, p in enumerate(result.points):
        base = p.baselines
        writer.writerow(
            [
                *(p.coords[a] for a in result.axes),
                p.status,
                p.slo_rps,
                p.demand_rps,
                p.cost_per_hour,
                "" if p.mip_gap is None else p.mip_gap,
                *(p.devices.get(n, 0) for n in names),
                *(p.bought.get(n, 0) for n in names),
                *(p.marginal_rps.get(n, "") for n in names),
                "" if base is None else base.gpu_only.slo_rps,
                "" if base is None else base.gpu_only.cost_per_hour,
                "" if base is None else base.greedy.slo_rps,
                "" if base is None else base.greedy.cost_per_hour,
                ";".join(p.binding),
                int(index in on_frontier),
            ]
        )
    return out.getvalue()
