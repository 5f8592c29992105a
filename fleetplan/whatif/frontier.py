"""The Pareto frontier of a sweep in (cost per hour lower, SLO RPS higher)."""

import numpy as np

from fleetplan.models.whatif import Point

# two costs or RPS closer than this (relative to the largest) count as equal: solver round-off, not a plan
TOL = 1e-6


def frontier(points: list[Point]) -> list[int]:
    """Indices of the points with a plan that no other point beats: none costs no more and serves no less
    with one of the two strictly better. Equal points (the same plan at several budgets) are all kept. A
    `min_cost` point the fleet cannot serve in full (status `infeasible`) has a plan too, the max-goodput
    one it falls back to, and counts like any (it was left out: a 1.75x-demand plan nothing beat showed
    grey)."""
    ok = [i for i, p in enumerate(points) if p.status in ("optimal", "feasible", "infeasible")]
    if not ok:
        return []
    cost = np.array([points[i].cost_per_hour for i in ok])
    rps = np.array([points[i].slo_rps for i in ok])
    scale_c, scale_r = TOL * max(1.0, cost.max()), TOL * max(1.0, rps.max())
    no_dearer = cost[None, :] <= cost[:, None] + scale_c  # [i, j]: j costs no more than i
    no_worse = rps[None, :] >= rps[:, None] - scale_r
    strictly = (cost[None, :] < cost[:, None] - scale_c) | (rps[None, :] > rps[:, None] + scale_r)
    dominated = (no_dearer & no_worse & strictly).any(axis=1)
    return [ok[k] for k in np.flatnonzero(~dominated)]
