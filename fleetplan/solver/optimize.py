"""Solve the MILP lexicographically: primary objective, then each tie-break with the previous optimum locked.

Primal heuristic first (HiGHS alone struggles to find incumbents on this model: it spends its time on root
cuts while the LP bound is already nearly tight). The LP relaxation is solved through every stage; its
primary value is the reported LP bound. Then a RENS-style sub-MIP: every x is boxed between the floor of
the smallest and the ceiling of the largest value it takes in those LP solutions (the max-goodput LP
spreads over device types, the min-cost LP packs them; together they span good integer plans), which
leaves a small MIP that HiGHS solves in a fraction of the time. Its plan (or, if it finds none, the
economical LP rounded within the devices) seeds the full MIP through setSolution.

A finished stage is locked at its value less a 1e-9 relative slack, not the whole MIP gap: a cost
tie-break must not buy its savings with goodput (a class would show a sliver "unserved").
Tie-break stages and the sub-MIP each get at most a share of the time limit; what they reach is reported.
"""

import time
from dataclasses import dataclass, replace

import numpy as np

from fleetplan.models.plan import PlanRequest
from fleetplan.solver.backends import Sense, SolveResult, Termination, get_backend
from fleetplan.solver.candidates import Candidates
from fleetplan.solver.formulation import Columns, MatrixForm, build_matrix

STAGES = {
    "max_goodput": [("goodput", Sense.MAX), ("cost", Sense.MIN)],
    "min_cost": [("cost", Sense.MIN)],
    "max_min_fraction": [("phi", Sense.MAX), ("goodput", Sense.MAX), ("cost", Sense.MIN)],
}


@dataclass(frozen=True)
class Outcome:
    """What the solver found for one request: the final vector and how sure it is."""

    candidates: Candidates
    columns: Columns
    form: MatrixForm
    values: np.ndarray | None
    termination: Termination
    primary_value: float | None
    primary_bound: float | None
    lp_bound: float | None
    build_ms: float
    solve_ms: float
    tie_break: str | None


def rounded_start(form: MatrixForm, cols: Columns, cand: Candidates, x_lp: np.ndarray) -> np.ndarray:
    """Integer instances near the LP optimum that respect device counts and the budget.

    Floor every x, then add one instance to pools in order of falling fractional part while the device
    (and budget) rows allow: what an engineer would do by hand with the LP's answer.
    """
    x = np.floor(x_lp + 1e-9)
    x = np.minimum(x, form.col_hi[: cols.n_pools])
    devices = cand.devices.set_index("device")
    tp = cand.pools["tp"].to_numpy(float)
    device_of = cand.pools["device"].to_numpy()
    free = (devices["count"] - (cand.pools.assign(u=x * tp).groupby("device")["u"].sum())).fillna(
        devices["count"]
    )
    budget = cand.request.options.budget_per_hour
    price = cand.pools["device"].map(devices["cost_per_hour"]).to_numpy(float) * tp
    spend = float(price @ x)
    for index in np.argsort(-(x_lp - x), kind="stable"):
        fraction = x_lp[index] - x[index]
        if fraction <= 1e-6:
            break
        fits = free[device_of[index]] >= tp[index] and x[index] + 1 <= form.col_hi[index]
        affordable = budget is None or spend + price[index] <= budget + 1e-9
        if fits and affordable:
            x[index] += 1
            free[device_of[index]] -= tp[index]
            spend += price[index]
    return x


LOCK_SLACK = 1e-9
TIE_BREAK_SHARE = 0.3
SUB_MIP_SHARE = 0.3


def _lock(form: MatrixForm, name: str, sense: Sense, value: float) -> MatrixForm:
    """Keep a finished stage's objective at the value found (up to a relative LOCK_SLACK for round-off)."""
    slack = LOCK_SLACK * max(1.0, abs(value))
    if sense is Sense.MAX:
        return form.with_row(f"lock_{name}", form.objectives[name], value - slack, np.inf)
    return form.with_row(f"lock_{name}", form.objectives[name], -np.inf, value + slack)


def optimize(
    request: PlanRequest, cand: Candidates, stages: list[tuple[str, Sense]] | None = None
) -> Outcome:
    """Build and solve within options.time_limit_s (over all stages)."""
    options = request.options
    began = time.perf_counter()
    deadline = began + options.time_limit_s
    form, cols = build_matrix(cand)
    build_ms = (time.perf_counter() - began) * 1e3
    stages = stages or STAGES[options.objective]
    backend = get_backend(options.solver)

    def remaining() -> float:
        return max(deadline - time.perf_counter(), 0.01)

    solve_began = time.perf_counter()
    name, sense = stages[0]
    lp_bound, start = None, None
    # the min-cost LP always joins the box: it packs devices where the goodput LP spreads them
    box_stages = stages if any(n == "cost" for n, _ in stages) else [*stages, ("cost", Sense.MIN)]
    relaxed = _relaxed_stages(form, box_stages, backend, remaining)
    if relaxed:
        lp_bound = relaxed[0].objective
        if form.integer.any():
            x_lps = np.array([r.values[: cols.n_pools] for r in relaxed if r.values is not None])
            sub_limit = min(remaining(), SUB_MIP_SHARE * options.time_limit_s)
            start = _sub_mip(form, cols, x_lps, name, sense, backend, sub_limit, options.mip_rel_gap)
            if start is None:
                start = _rounded_flows(form, cols, cand, x_lps[-1], name, sense, backend, remaining())
    result = backend.solve(
        form,
        form.objectives[name],
        sense,
        time_limit_s=remaining(),
        mip_rel_gap=options.mip_rel_gap,
        start=start,
    )
    primary = result
    tie_break = None
    for next_name, next_sense in stages[1:]:
        if not result.has_solution or result.objective is None:
            break
        if time.perf_counter() >= deadline:
            tie_break = f"skipped {next_name}: time limit reached"
            break
        form_locked = _lock(form, name, sense, result.objective)
        follow = backend.solve(
            form_locked,
            form.objectives[next_name],
            next_sense,
            time_limit_s=min(remaining(), TIE_BREAK_SHARE * options.time_limit_s),
            mip_rel_gap=options.mip_rel_gap,
            start=result.values,
        )
        if not follow.has_solution:
            tie_break = f"{next_name}: {follow.termination} ({follow.detail}); kept the previous stage's plan"
            break
        gap = "" if follow.gap is None else f", gap {follow.gap:.2%}"
        tie_break = f"{next_name}: {follow.termination}{gap} in {follow.seconds:.2f} s"
        form, name, sense, result = form_locked, next_name, next_sense, follow
    return Outcome(
        candidates=cand,
        columns=cols,
        form=form,
        values=result.values,
        termination=_overall(primary, result),
        primary_value=primary.objective,
        primary_bound=primary.bound,
        lp_bound=lp_bound,
        build_ms=build_ms,
        solve_ms=(time.perf_counter() - solve_began) * 1e3,
        tie_break=tie_break,
    )


def _overall(primary: SolveResult, last: SolveResult) -> Termination:
    """Optimal only if the primary stage was proven optimal and the plan kept is a solution."""
    if not last.has_solution:
        return primary.termination
    if primary.termination is Termination.OPTIMAL:
        return Termination.OPTIMAL
    return Termination.FEASIBLE if primary.has_solution else primary.termination


def _relaxed_stages(form: MatrixForm, stages, backend, remaining) -> list[SolveResult]:
    """The LP relaxation through every stage, each optimum locked for the next; stops at the first failure."""
    results = []
    for name, sense in stages:
        result = backend.solve(
            form, form.objectives[name], sense, time_limit_s=remaining(), mip_rel_gap=0.0, relax=True
        )
        if result.objective is None:
            break
        results.append(result)
        form = _lock(form, name, sense, result.objective)
    return results


def _sub_mip(
    form: MatrixForm,
    cols: Columns,
    x_lps: np.ndarray,
    name: str,
    sense: Sense,
    backend,
    time_limit_s: float,
    mip_rel_gap: float,
) -> np.ndarray | None:
    """The MIP with every x boxed in [floor(min over LP solutions), ceil(max over LP solutions)]."""
    boxed = replace(form, col_lo=form.col_lo.copy(), col_hi=form.col_hi.copy())
    boxed.col_lo[: cols.n_pools] = np.floor(x_lps.min(axis=0) + 1e-9)
    boxed.col_hi[: cols.n_pools] = np.minimum(np.ceil(x_lps.max(axis=0) - 1e-9), form.col_hi[: cols.n_pools])
    boxed.col_lo[: cols.n_pools] = np.minimum(boxed.col_lo[: cols.n_pools], boxed.col_hi[: cols.n_pools])
    result = backend.solve(
        boxed, form.objectives[name], sense, time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap
    )
    return result.values


def _rounded_flows(
    form: MatrixForm,
    cols: Columns,
    cand: Candidates,
    relaxed_values: np.ndarray,
    name: str,
    sense: Sense,
    backend,
    time_limit_s: float,
) -> np.ndarray | None:
    """Round the relaxation's x and re-solve the flows with x fixed: a full feasible start vector."""
    x = rounded_start(form, cols, cand, relaxed_values[: cols.n_pools])
    fixed = replace(form, col_lo=form.col_lo.copy(), col_hi=form.col_hi.copy())
    fixed.col_lo[: cols.n_pools] = x
    fixed.col_hi[: cols.n_pools] = x
    result = backend.solve(
        fixed, form.objectives[name], sense, time_limit_s=time_limit_s, mip_rel_gap=0.0, relax=True
    )
    return result.values
