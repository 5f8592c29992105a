"""Sub-MIPs around the incumbent, for instances whose full MIP cannot end its root in the time limit.

On the L bench instances (thousands of integer columns, one LP relaxation taking 4-10% of a 10 s limit) the
full MIP spends all the time it gets on its root node (cuts, root heuristics) and never improves the start:
0 nodes, and the plan is the start's sub-MIP plan, 2.3-4.1% below the bound. `improve` spends part of that
time on small MIPs instead, each the model with most instance counts held at the incumbent's (a large
neighbourhood search; docs/solvers.md, "Neighbourhoods on large instances"):

- `box`: every pool the incumbent runs or the LP relaxation uses may move one instance up or down; the
  others stay as they are;
- `devices`: every pool on a quarter of the device types is free within its bounds; the device types are
  taken in turn, a quarter at a time.

A neighbourhood's MIP starts from the incumbent, so it returns at least the incumbent. A better plan
becomes the incumbent; the search ends when every neighbourhood has been tried on the current incumbent
without improving it, or when its time is up.
"""

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fleetplan.solver.backends import Sense, SolveResult
from fleetplan.solver.candidates import Candidates
from fleetplan.solver.formulation import Columns, MatrixForm

# the share of the device types one `devices` neighbourhood frees
DEVICE_SHARE = 0.25
# a neighbourhood's plan replaces the incumbent only when it is better by more than this (relative)
IMPROVEMENT = 1e-9

# solve(form with most x fixed, time limit in s, start) -> the sub-MIP's result
SubSolve = Callable[[MatrixForm, float, np.ndarray], SolveResult]


def device_chunks(cand: Candidates) -> list[np.ndarray]:
    """The device types with pools, in chunks of DEVICE_SHARE of them (sorted by name)."""
    types = np.unique(cand.pools["device"].to_numpy())
    per = max(1, int(np.ceil(len(types) * DEVICE_SHARE)))
    return [types[first : first + per] for first in range(0, len(types), per)]


def neighbourhoods(cand: Candidates) -> list[tuple[str, int]]:
    """The neighbourhoods tried around one incumbent, in order: the box, then each chunk of device types."""
    return [("box", 0), *(("devices", chunk) for chunk in range(len(device_chunks(cand))))]


def free_pools(cand: Candidates, x: np.ndarray, x_lp: np.ndarray, kind: str, chunk: int) -> np.ndarray:
    """Which pools a neighbourhood frees (bool per pool)."""
    if kind == "box":
        return (x > 0) | (x_lp > 1e-6)
    return np.isin(cand.pools["device"].to_numpy(), device_chunks(cand)[chunk])


def neighbourhood_form(
    form: MatrixForm, cols: Columns, x: np.ndarray, free: np.ndarray, kind: str
) -> MatrixForm:
    """`form` with every pool outside `free` held at its instances in `x`; a `box` moves the free ones by at
    most one instance."""
    n = cols.n_pools
    lo, hi = form.col_lo.copy(), form.col_hi.copy()
    step = 1.0 if kind == "box" else np.inf
    lo[:n] = np.where(free, np.maximum(lo[:n], x - step), x)
    hi[:n] = np.where(free, np.minimum(hi[:n], x + step), x)
    return replace(form, col_lo=lo, col_hi=hi)


def improve(
    cand: Candidates,
    form: MatrixForm,
    cols: Columns,
    start: np.ndarray,
    x_lp: np.ndarray,
    stage: tuple[str, Sense],
    solve: SubSolve,
    time_left: Callable[[], float],
    call_s: float,
) -> np.ndarray:
    """The best plan found by the neighbourhoods' sub-MIPs around `start` (itself when none is better),
    while `time_left()` is positive, each sub-MIP at most `call_s` seconds."""
    name, sense = stage
    sign = 1.0 if sense is Sense.MAX else -1.0
    objective = form.objectives[name]
    best, best_value = start, sign * float(objective @ start)
    untried = neighbourhoods(cand)
    while untried and time_left() > 0:
        kind, chunk = untried.pop(0)
        x = np.round(best[: cols.n_pools])
        free = free_pools(cand, x, x_lp, kind, chunk)
        result = solve(neighbourhood_form(form, cols, x, free, kind), min(call_s, time_left()), best)
        if result.values is None:
            continue
        value = sign * float(objective @ result.values)
        if value > best_value + IMPROVEMENT * max(1.0, abs(best_value)):
            best, best_value = result.values, value
            # every neighbourhood again around the new incumbent, the one that found it last
            untried = [n for n in neighbourhoods(cand) if n != (kind, chunk)] + [(kind, chunk)]
    return best
