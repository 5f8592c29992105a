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
   holds only with all c of them behind the queue), and their `rho` is the pooled one;
4. a pool shape the MILP split into several pools (headroom levels, mixes) is tried as one pool of all
   its instances, carrying every class they carried (`_merged`), shape by shape, fewest instances first:
   steps 1-2 again, kept where the LP serves more than the best so far. One pool behind one queue has
   every instance to join, but its classes then share one FIFO queue, so which is better is the model's
   call, per shape.

The instance counts, the devices and the cost do not change: the credit serves more on the same hardware.
docs/formulation.md ("Pools of several instances") has the formulas and the evidence against the
simulator; `options.objective = "max_goodput"` under the queueing model only.
"""

import dataclasses
import time

import numpy as np
import pandas as pd
import scipy.sparse as sp

from fleetplan.models.plan import Options, PlanRequest, StageRecord, StageStep
from fleetplan.solver.backends import Sense, SolveResult, get_backend
from fleetplan.solver.candidates import Candidates
from fleetplan.solver.deadline import Deadline
from fleetplan.solver.formulation import MatrixForm, pool_keys, use_demand
from fleetplan.solver.headroom import kept_on, pooled_rho
from fleetplan.solver.optimize import Outcome

FLOW_EPS = 1e-9  # a use carries flow above this (RPS)
MIN_GAIN = 1e-6  # relative goodput gain below which the MILP's plan is kept as it is
TIME_LIMIT_S = 1.0  # the LP re-solve's own limit (it takes milliseconds)
# under a deadline, the least LP time limit left (after the deadline's reserve for the plan's assembly,
# baselines and verification) for the credit to begin, or its next step
MIN_LP_S = 0.05


def gives_flow_up(request: PlanRequest, cand: Candidates) -> bool:
    """Whether the passes after the MILP (this credit, solver/window.py's guard) may move the plan's
    flows on fixed instances: a `max_goodput` plan under the queueing model, not a churn-limited re-plan
    (a plan that must serve all its demand, or the same fraction of every class, cannot give flow up)."""
    options = request.options
    return options.objective == "max_goodput" and options.capacity_model == "queueing" and cand.churn is None


def pool_credit(
    request: PlanRequest, cand: Candidates, outcome: Outcome, deadline: Deadline | None = None
) -> tuple[Candidates, Outcome]:
    """(candidates, outcome) with the pooled headroom of the module docstring, or the inputs unchanged
    when it does not apply, serves no more, or `deadline` leaves its LPs less than MIN_LP_S beyond its
    reserve for the rest of the pipeline (the credit is a gain, never a requirement)."""
    if _out_of_time(deadline):
        return cand, outcome
    if outcome.values is None or not gives_flow_up(request, cand):
        return cand, outcome
    began = time.perf_counter()
    cols, values = outcome.columns, outcome.values
    x = np.round(values[: cols.n_pools]).astype(np.int64)
    carrying = values[cols.use_offset : cols.chain_offset] > FLOW_EPS
    goodput = outcome.form.objectives["goodput"]
    best = _Credit(float(goodput @ values), x, carrying, None, None, None)
    calls: list[tuple[str, SolveResult, float]] = []  # every LP of the pass, for the stage records
    trial = _credited(cand, outcome, x, carrying, _lp_limit(deadline), calls)
    if trial is not None and trial.value > best.value * (1 + MIN_GAIN):
        best = trial
    shapes = _shape_tables(cand)
    for shape in _shapes_split(shapes, x):  # step 4: one pool per shape where the model credits it more
        if _out_of_time(deadline):
            break
        merged = _merged(shapes, best.x, best.carrying, shape)
        trial = None if merged is None else _credited(cand, outcome, *merged, _lp_limit(deadline), calls)
        if trial is not None and trial.value > best.value * (1 + MIN_GAIN):
            best = trial
    if best.result is None:
        return cand, outcome
    ms = (time.perf_counter() - began) * 1e3
    new_outcome = dataclasses.replace(
        outcome,
        values=best.result.values,
        solve_ms=outcome.solve_ms + ms,
        stages=(*outcome.stages, *stage_records(outcome, calls, "pooled")),
    )
    pools = cand.pools.assign(rho=best.rho, pooled=np.where(best.raised, best.x, 1))
    return dataclasses.replace(cand, pools=pools), new_outcome


def _lp_limit(deadline: Deadline | None) -> float:
    """The next LP's time limit: TIME_LIMIT_S, within what `deadline` leaves beyond its reserve now."""
    return TIME_LIMIT_S if deadline is None else deadline.solver_time_limit(TIME_LIMIT_S)


def _out_of_time(deadline: Deadline | None) -> bool:
    """Whether `deadline` leaves the credit's next LP less than MIN_LP_S (`_lp_limit`)."""
    return _lp_limit(deadline) < MIN_LP_S


@dataclasses.dataclass(frozen=True)
class _Credit:
    """One instance split and its credited LP: goodput, instances per pool, the uses that carry flow, the
    LP's result, and the pools' headroom with the pools whose headroom rose (None: the MILP's plan)."""

    value: float
    x: np.ndarray
    carrying: np.ndarray
    result: SolveResult | None
    rho: np.ndarray | None
    raised: np.ndarray | None


def _credited(
    cand: Candidates,
    outcome: Outcome,
    x: np.ndarray,
    carrying: np.ndarray,
    limit: float,
    calls: list[tuple[str, SolveResult, float]],
) -> _Credit | None:
    """Steps 1-2 for the instances `x` with the uses `carrying`: None when no pool's headroom rises or the
    LP finds no plan. The LP's result and ms join `calls`."""
    credit = _pooled_pool_rho(cand, x, carrying)
    if credit is None:
        return None
    new_rho, raised, blocked = credit
    cols = outcome.columns
    integers = np.round(outcome.values)
    # a flow of a pool whose headroom rose, or that took another pool's instances, is bounded by its
    # class's demand (NaN: its bound stays)
    lifted = raised | (x > integers[: cols.n_pools])
    integers[: cols.n_pools] = x
    flow_hi = np.where(lifted[cand.uses["pool"].to_numpy()], use_demand(cand), np.nan)
    form = fixed_form(outcome.form, cols, integers, new_rho, raised, blocked, flow_hi)
    result = fixed_lp(form, "goodput", cand.request.options, limit, calls)
    if result is None or result.objective is None:
        return None
    return _Credit(float(result.objective), x, carrying, result, new_rho, raised)


def fixed_lp(
    form: MatrixForm, stage: str, options: Options, limit: float, calls: list[tuple[str, SolveResult, float]]
) -> SolveResult | None:
    """Maximize `stage`'s objective over `form` as an LP (its instances fixed: fixed_form); the result, its
    stage and its ms join `calls`; None without a plan. The credit's LP and the window guard's."""
    began = time.perf_counter()
    result = get_backend(options.solver).solve(
        form,
        form.objectives[stage],
        Sense.MAX,
        time_limit_s=limit,
        mip_rel_gap=options.mip_rel_gap,
        relax=True,
    )
    calls.append((stage, result, (time.perf_counter() - began) * 1e3))
    return result if result.has_solution and result.values is not None else None


@dataclasses.dataclass(frozen=True)
class _Shapes:
    """What step 4 reads of a candidate set: each pool's shape (pool_keys), each use's pool and (class,
    decode key) pair as an integer, and each pool's NIC cap and headroom."""

    shape: np.ndarray
    pool: np.ndarray
    pair: np.ndarray
    nic_rho: np.ndarray
    rho: np.ndarray


def _shape_tables(cand: Candidates) -> _Shapes:
    """The _Shapes of `cand`, kept on it (a what-if sweep credits many plans on one candidate set)."""
    uses, pools = cand.uses, cand.pools

    def build() -> _Shapes:
        pair, _ = pd.factorize(pd.MultiIndex.from_arrays([uses["w"], uses["key"]]))
        return _Shapes(
            pool_keys(cand),
            uses["pool"].to_numpy(),
            np.asarray(pair),
            pools["nic_rho"].to_numpy(float),
            pools["rho"].to_numpy(float),
        )

    return kept_on(cand, "pool_shapes", (uses, pools), build)


def _shapes_split(shapes: _Shapes, x: np.ndarray) -> list[int]:
    """The pool shapes (pool_keys numbers) whose instances the plan runs as two or more pools (headroom
    levels, mixes), fewest instances first."""
    key = shapes.shape
    pools_per_shape = np.bincount(key[x >= 1], minlength=int(key.max(initial=-1)) + 1)
    instances = np.bincount(key, weights=x, minlength=len(pools_per_shape))
    split = np.flatnonzero(pools_per_shape >= 2)
    return [int(s) for s in split[np.argsort(instances[split], kind="stable")]]


def _merged(
    shapes: _Shapes, x: np.ndarray, carrying: np.ndarray, shape: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The plan with every instance of pool shape `shape` in one pool of that shape, which carries every
    class those instances carried (the same (class, decode key) uses): the pool of the shape that offers
    them all at the highest NIC cap, then headroom. None where no pool of the shape offers them all."""
    pool, pair = shapes.pool, shapes.pair
    mine = np.flatnonzero(shapes.shape == shape)
    running = mine[x[mine] >= 1]
    on_running = np.isin(pool, running)
    carried = np.unique(pair[on_running & carrying])
    covering = [p for p in mine if np.isin(carried, pair[pool == p]).all()]
    if not covering:
        return None
    target = max(covering, key=lambda p: (shapes.nic_rho[p], shapes.rho[p], -p))
    merged_x = x.copy()
    merged_x[running] = 0
    merged_x[target] = x[running].sum()
    merged_carrying = (carrying & ~on_running) | ((pool == target) & np.isin(pair, carried))
    return merged_x, merged_carrying


def stage_records(
    outcome: Outcome, calls: list[tuple[str, SolveResult, float]], step: StageStep
) -> list[StageRecord]:
    """A StageRecord per LP of a pass after the MILP, in order: `step` ("pooled": this module's, the plan
    kept the one of the largest objective; "window": solver/window.py's) and the LP's stage ("goodput";
    the guard's "phi" first on a max_min_fraction plan), timed from the end of the last call before it."""
    ended = outcome.stages[-1].ended_ms if outcome.stages else outcome.build_ms
    records = []
    for stage, result, ms in calls:
        ended += ms
        records.append(
            StageRecord(
                step=step,
                stage=stage,
                kind="lp",
                ms=round(ms, 3),
                ended_ms=round(ended, 3),
                termination=str(result.termination),
                objective=result.objective,
                bound=result.bound,
                gap=result.gap,
                nodes=result.nodes,
            )
        )
    return records


def _pooled_pool_rho(
    cand: Candidates, x: np.ndarray, carrying: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(rho per pool, the pools whose rho rose, uses blocked at 0) with the pooled headroom of every pool
    of >= 2 instances for the uses `carrying` flow; None when no pool gains."""
    uses = cand.uses
    pool = uses["pool"].to_numpy()
    carrying = carrying & (x[pool] >= 2)
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


def fixed_form(
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
    row_lo, row_hi = form.row_lo.copy(), form.row_hi.copy()
    blocks = {name: (start, end) for name, start, end in form.row_blocks}
    start, _ = blocks["capacity"]
    a = _with_capacity_coefficients(form.A, start, np.flatnonzero(raised), rho)
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
    return dataclasses.replace(form, A=a, row_lo=row_lo, row_hi=row_hi, col_lo=col_lo, col_hi=col_hi)


def _with_capacity_coefficients(
    A: sp.csr_matrix, start: int, pools: np.ndarray, rho: np.ndarray
) -> sp.csr_matrix:
    """A copy of A with the x coefficient of each of `pools`' capacity rows (row start + p, column p) set to
    -rho[p], in place in the CSR arrays (a LIL round trip took ~15 ms per call on paper.json); an entry
    the matrix does not hold (a coefficient that was 0) is added."""
    a = A.tocsr(copy=True)
    a.sort_indices()
    absent = []
    for p in pools:  # the raised pools: tens at most
        lo, hi = a.indptr[start + p], a.indptr[start + p + 1]
        k = lo + int(np.searchsorted(a.indices[lo:hi], p))
        if k < hi and a.indices[k] == p:
            a.data[k] = -rho[p]
        else:
            absent.append(p)
    if absent:
        cols = np.asarray(absent)
        a = a + sp.csr_matrix((-rho[cols], (start + cols, cols)), shape=a.shape)
    return a
