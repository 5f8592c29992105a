"""Pools of several instances: the credit join-shortest-queue gives them, applied after the MILP.

The MILP plans every instance as its own queue (fleetplan/solver/capacity.py): a request that finds its
instance busy waits, whatever the other instances of its pool are doing. Behind join-shortest-queue a
request waits only when every instance of the pool is busy, which for c instances is far less likely than
for one (Erlang C, `capacity.pooled_wait_prob`). The admissible load of a pool therefore grows with its
size, which is not linear in the instance count, so it is applied to the plan the MILP chose:

1. every pool the plan runs with c >= 2 instances gets the admissible utilization of the classes it
   carries at c instances (`headroom.pooled_rho`, their FIFO shares taken within the pool);
2. with every instance count fixed at the plan's, the LP of the goodput stage is solved again with those
   utilizations (a use that carried no flow stays at 0: the pool's waits were computed without it);
3. the result replaces the plan when it serves more; the pools keep their instance counts (the credit
   holds only with all c of them behind the queue), and their `rho` is the pooled one.

The instance counts, the devices and the cost do not change: the credit serves more on the same hardware.
docs/formulation.md ("Pools of several instances") has the formulas and the evidence against the
simulator; `options.objective = "max_goodput"` under the queueing model only.
"""

import dataclasses
import time

import numpy as np

from fleetplan.models.plan import PlanRequest, StageRecord
from fleetplan.solver.backends import Sense, SolveResult, get_backend
from fleetplan.solver.candidates import Candidates
from fleetplan.solver.deadline import Deadline
from fleetplan.solver.formulation import MatrixForm, use_demand
from fleetplan.solver.headroom import pooled_rho
from fleetplan.solver.optimize import Outcome

FLOW_EPS = 1e-9  # a use carries flow above this (RPS)
MIN_GAIN = 1e-6  # relative goodput gain below which the MILP's plan is kept as it is
TIME_LIMIT_S = 1.0  # the LP re-solve's own limit (it takes milliseconds)
MIN_BUDGET_SHARE = 0.25  # of the request's time budget left after the solve, or the credit is skipped


def pool_credit(
    request: PlanRequest, cand: Candidates, outcome: Outcome, deadline: Deadline | None = None
) -> tuple[Candidates, Outcome]:
    """(candidates, outcome) with the pooled headroom of the module docstring, or the inputs unchanged
    when it does not apply, serves no more, or `deadline` leaves less than MIN_BUDGET_SHARE of the
    request's budget (the rest of the pipeline needs it: the credit is a gain, never a requirement)."""
    options = request.options
    if deadline is not None and deadline.remaining() < MIN_BUDGET_SHARE * deadline.budget_s:
        return cand, outcome
    if (
        outcome.values is None
        or options.objective != "max_goodput"
        or options.capacity_model != "queueing"
        or cand.churn is not None
    ):
        return cand, outcome
    began = time.perf_counter()
    cols, values = outcome.columns, outcome.values
    x = np.round(values[: cols.n_pools]).astype(np.int64)
    flow = values[cols.use_offset : cols.chain_offset]
    credit = _pooled_pool_rho(cand, x, flow)
    if credit is None:
        return cand, outcome
    new_rho, raised, blocked = credit
    # a flow of a pool whose headroom rose is bounded by its class's demand (NaN: its bound stays)
    flow_hi = np.where(raised[cand.uses["pool"].to_numpy()], use_demand(cand), np.nan)
    form = _fixed_form(outcome.form, cols, np.round(values), new_rho, raised, blocked, flow_hi)
    goodput = outcome.form.objectives["goodput"]
    limit = TIME_LIMIT_S if deadline is None else deadline.solver_time_limit(TIME_LIMIT_S)
    result = get_backend(options.solver).solve(
        form, goodput, Sense.MAX, time_limit_s=limit, mip_rel_gap=options.mip_rel_gap, relax=True
    )
    before = float(goodput @ values)
    if not result.has_solution or result.objective is None or result.objective <= before * (1 + MIN_GAIN):
        return cand, outcome
    ms = (time.perf_counter() - began) * 1e3
    new_outcome = dataclasses.replace(
        outcome,
        values=result.values,
        solve_ms=outcome.solve_ms + ms,
        stages=(*outcome.stages, _record(outcome, result, ms)),
    )
    pools = cand.pools.assign(rho=new_rho, pooled=np.where(raised, x, 1))
    return dataclasses.replace(cand, pools=pools), new_outcome


def _record(outcome: Outcome, result: SolveResult, ms: float) -> StageRecord:
    """The pass's StageRecord: step "pooled", the goodput LP, timed from the end of the MILP's last call."""
    ended = outcome.stages[-1].ended_ms if outcome.stages else outcome.build_ms
    return StageRecord(
        step="pooled",
        stage="goodput",
        kind="lp",
        ms=round(ms, 3),
        ended_ms=round(ended + ms, 3),
        termination=str(result.termination),
        objective=result.objective,
        bound=result.bound,
        gap=result.gap,
        nodes=result.nodes,
    )


def _pooled_pool_rho(
    cand: Candidates, x: np.ndarray, flow: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(rho per pool, the pools whose rho rose, uses blocked at 0) with the pooled headroom of every pool
    of >= 2 instances; None when no pool gains."""
    uses = cand.uses
    pool = uses["pool"].to_numpy()
    carrying = (flow > FLOW_EPS) & (x[pool] >= 2)
    if not carrying.any():
        return None
    rows = np.flatnonzero(carrying)
    use_rho = pooled_rho(cand, rows, x[pool[rows]])
    old = cand.pools["rho"].to_numpy(float)
    lowest = np.full(len(old), np.inf)
    np.minimum.at(lowest, pool[carrying], use_rho)
    new = np.where(np.isfinite(lowest), np.maximum(lowest, old), old)
    raised = new > old + 1e-12
    if not raised.any():
        return None
    # in a pool whose headroom rose, only the uses it was computed for may carry flow
    return new, raised, raised[pool] & ~carrying


def _fixed_form(
    form: MatrixForm,
    cols,
    integers: np.ndarray,
    rho: np.ndarray,
    raised: np.ndarray,
    blocked: np.ndarray,
    flow_hi: np.ndarray,
) -> MatrixForm:
    """The MILP as an LP: every integer column fixed at its value in `integers` (the plan's vector, rounded),
    the capacity rows at `rho`, the blocked uses at 0, and what bounds a flow by the old headroom dropped:
    the linking rows and, in the pools whose headroom rose, the flow columns' bound `rho r x_hi`
    (`formulation.column_bounds`; it binds where a pool runs every instance its devices allow), replaced by
    `flow_hi` (per use: the class's demand; NaN where the bound stays)."""
    a = form.A.tolil(copy=True)
    row_lo, row_hi = form.row_lo.copy(), form.row_hi.copy()
    blocks = {name: (start, end) for name, start, end in form.row_blocks}
    start, _ = blocks["capacity"]
    for p in np.flatnonzero(raised):
        a[start + p, p] = -rho[p]
    # f <= min(demand, rho r) x: implied by the demand and capacity rows once x is fixed, and stale here
    link_start, link_end = blocks.get("linking", (0, 0))
    row_lo[link_start:link_end], row_hi[link_start:link_end] = -np.inf, np.inf
    # every integer column fixed at the plan's (instances, and the devices bought and used with them)
    col_lo, col_hi = form.col_lo.copy(), form.col_hi.copy()
    fixed = np.flatnonzero(form.integer)
    col_lo[fixed] = col_hi[fixed] = integers[fixed]
    flows = slice(cols.use_offset, cols.use_offset + len(flow_hi))
    col_hi[flows] = np.where(np.isfinite(flow_hi), flow_hi, col_hi[flows])
    col_hi[cols.use_offset + np.flatnonzero(blocked)] = 0.0
    return dataclasses.replace(form, A=a.tocsr(), row_lo=row_lo, row_hi=row_hi, col_lo=col_lo, col_hi=col_hi)
