"""The judged window's guard on a plan's prefill and decode pools, applied after the MILP and the pooled
credit.

The promise is judged on one 600 s window per seed (../shared/design/capacity.md). The MILP admits every
use at TAIL_MARGIN of its class's tail probability (fleetplan/solver/capacity.py), a long-run figure.
Behind a loaded queue a class's requests above a level come in congestion episodes, and one window holds
few of them, so the window's percentile scatters far beyond the long-run one: a p99 class planned at p99.5
on one prefill instance breaks a window 8-16% of the time at loads 0.5-0.9, and a decode slot queue's p90
class up to 16% at 0.9 (bench/window_scatter.py). `capacity.window_epsilon` tightens the planned tail
where that window's count above the level would pass the class's tail more than WINDOW_DELTA of the time;
the count depends on how many requests the class has in the window, which only the plan says. So:

1. each class's requests in one window, N_w = served_w x WINDOW_MS, from the plan;
2. every prefill and decode use that carries flow gets its admissible utilization again at its pool's
   instance count (the credited count where the pooled credit applied, else one) with that N_w
   (`headroom.pooled_rho`; colocated uses are not guarded: their TTFT form is optimistic near its knee,
   and has no window form yet);
3. a pool whose headroom falls takes the lower one and, every instance count fixed, the goodput LP is solved
   again (`pooled.fixed_form`). Serving less lowers N_w, so steps 1-3 repeat until no pool falls (at most
   ROUNDS times).

Instances, devices and cost stay the MILP's: the guard serves less on the same hardware where one window
would break the class too often. It applies to `max_goodput` plans under the queueing model, churn-limited
re-plans among them (it moves no instance), and to `max_min_fraction` plans, which give flow up as a smaller
common fraction (phi, then goodput, on fixed instances: `_solve_fixed`; both since session 23). A plan that
must serve all its demand cannot give up flow on fixed instances: a `min_cost` plan is solved on tables
capped at the guard's headroom (`optimize_guarded`). docs/formulation.md ("One window's scatter",
"The other objectives") has the formulas and the measurements.
"""

import dataclasses
import time

import msgspec
import numpy as np

from fleetplan.models.plan import PlanRequest, StageRecord
from fleetplan.solver import capacity, scatter
from fleetplan.solver.backends import Sense, SolveResult, Termination
from fleetplan.solver.candidates import Candidates, keep_pools
from fleetplan.solver.deadline import Deadline, after_solve_s, holding, seconds_left
from fleetplan.solver.extract import capacity_used, served_by_class
from fleetplan.solver.formulation import MatrixForm, servable_demand, use_demand
from fleetplan.solver.headroom import pool_queues, pooled_rho
from fleetplan.solver.optimize import Outcome, lock_stage, optimize
from fleetplan.solver.pooled import (
    FLOW_EPS,
    TIME_LIMIT_S,
    fixed_form,
    fixed_lp,
    pool_credit,
    stage_records,
)

ROUNDS = 4  # guard rounds at most: each lowers N_w, and with it the margin, a little less
MIN_ROUND_S = 0.05  # optimize_guarded starts no round with less of the time limit left (s)
IN_FULL_TOL = 1e-7  # a class counts as served in full within this share of its demand (in_full_guarded)
FLOW_TOL = 1e-7  # ... and this much (RPS): the solver's feasibility tolerance on the fold's demand rows


def settle(
    request: PlanRequest,
    cand: Candidates,
    outcome: Outcome,
    deadline: Deadline | None = None,
    fell_back: bool = False,
) -> tuple[Candidates, Outcome]:
    """The plan's headroom after the MILP, as every caller applies it: a plan that serves everything served
    in full within the guard where it can be (`in_full_guarded`), the pooled credit (solver/pooled.py),
    then the window guard (`window_guard`). Under `deadline`, the first two leave what the guard and the
    rest of the plan need (deadline.after_solve_s); the guard, which keeps the promise, holds back only the
    deadline's share, so that it is never starved by the estimate. A min_cost request's max-goodput
    fallback (`fell_back`) is not served in full again: its min_cost solve on that headroom just failed."""
    reserving = holding(deadline, sum(after_solve_s(len(cand.uses))))
    if not fell_back:
        cand, outcome = in_full_guarded(request, cand, outcome, reserving)
    cand, outcome = pool_credit(request, cand, outcome, reserving)
    return window_guard(request, cand, outcome, deadline)


def in_full_guarded(
    request: PlanRequest,
    cand: Candidates,
    outcome: Outcome,
    deadline: Deadline | None = None,
) -> tuple[Candidates, Outcome]:
    """A `max_goodput` or `max_min_fraction` plan that serves every class in full (a class no candidate
    pool serves has nothing to serve: formulation.servable_demand; the one-solve
    tie-break, optimize.fold_stages, or a staged solve that serves it all) but whose pools the guard would
    lower: the lexicographic optimum within the promise then serves it all too where the fleet can (phi 1,
    all the goodput there is), so it is the `min_cost` plan, solved as a `min_cost` request is
    (`optimize_guarded`: on the guard's headroom for whole-demand windows, with what is left of the time
    limit). That plan where it serves every class and the guard holds on it (its cost MIP's gap in
    SolverInfo.tie_break, as for the folded solve); the inputs otherwise (and without trying where less
    time is left than the first solve took), which `window_guard` then guards by giving flow up on the
    same hardware (docs/formulation.md, "A `max_goodput` plan that serves every class in full")."""
    if not _in_full(request, cand, outcome):
        return cand, outcome
    entered = time.perf_counter()
    began = entered - (outcome.stages[-1].ended_ms / 1e3 if outcome.stages else 0.0)
    left = seconds_left(request.options.time_limit_s, began, deadline)
    if left < max(MIN_ROUND_S, (outcome.build_ms + outcome.solve_ms) / 1e3):
        return cand, outcome
    options = msgspec.structs.replace(request.options, objective="min_cost", time_limit_s=left)
    as_cost = msgspec.structs.replace(request, options=options)
    # min_cost of what any plan can serve: a class no candidate pool serves asks for nothing there
    servable = cand.classes.assign(rate_rps=servable_demand(cand))
    again = optimize_guarded(as_cost, dataclasses.replace(cand, request=as_cost, classes=servable), deadline)
    joined = _joined(outcome, again, began)
    solve_ms = outcome.solve_ms + (time.perf_counter() - entered) * 1e3
    # goodput is proven (every class in full is the bound); the cost MIP's own gap goes to tie_break
    kept = again.values is not None and _in_full(request, again.candidates, again, held=True)
    if not kept:  # the plan stays, the re-solve's calls join its stages
        return cand, dataclasses.replace(outcome, stages=joined.stages, solve_ms=solve_ms)
    last = next((r for r in reversed(again.stages) if r.step == "primary"), None)
    served = dataclasses.replace(
        joined,
        candidates=dataclasses.replace(again.candidates, request=request, classes=cand.classes),
        primary_value=outcome.primary_value,  # every class in full: the same goodput (and phi 1)
        primary_bound=outcome.primary_bound,
        lp_bound=outcome.lp_bound,
        build_ms=outcome.build_ms,
        solve_ms=solve_ms,
        tie_break=_in_full_message(last),
        tie_break_gap=None if last is None else last.gap,
    )
    return served.candidates, served


def _in_full_message(last: StageRecord | None) -> str:
    """SolverInfo.tie_break of a plan served in full on the guard's headroom: how its cost MIP ended."""
    if last is None:
        return "cost: served in full on the window guard's headroom"
    gap = "" if last.gap is None else f", gap {last.gap:.2%}"
    ended = f"cost: {last.termination}{gap} in {last.ms / 1e3:.2f} s"
    return f"{ended} (served in full on the window guard's headroom)"


def _in_full(request: PlanRequest, cand: Candidates, outcome: Outcome, held: bool = False) -> bool:
    """Whether `outcome` (on tables `cand`) is a guarded `max_goodput` or `max_min_fraction` plan that
    serves every class's whole demand (within IN_FULL_TOL of it, and FLOW_TOL; a class no candidate pool
    serves has none, formulation.servable_demand) and whose pools the guard
    would lower, or with `held`, would not."""
    if (
        outcome.values is None
        or request.options.objective not in ("max_goodput", "max_min_fraction")
        or not guard_applies(request, cand)
    ):
        return False
    cols = outcome.columns
    flow = outcome.values[cols.use_offset : cols.use_offset + len(cand.uses)]
    served = served_by_class(cand, np.maximum(flow, 0.0))
    demand = servable_demand(cand)  # a class no candidate pool serves: nothing to serve in full
    if (served < demand * (1 - IN_FULL_TOL) - FLOW_TOL).any():
        return False
    falls = _guarded_rho(cand, outcome, outcome.values, cand.pools["rho"].to_numpy(float)) is not None
    return falls != held


def window_guard(
    request: PlanRequest, cand: Candidates, outcome: Outcome, deadline: Deadline | None = None
) -> tuple[Candidates, Outcome]:
    """(candidates, outcome) with the prefill and decode pools' headroom lowered where one judged window
    would break a class too often (the module docstring), or the inputs unchanged where no pool falls (or
    the LP finds no plan, which fixed instances and flows that may fall to 0 rule out). Every LP it solves
    is recorded as step "window"."""
    if outcome.values is None or not guard_applies(request, cand):
        return cand, outcome
    began = time.perf_counter()
    limit = TIME_LIMIT_S if deadline is None else deadline.solver_time_limit(TIME_LIMIT_S)
    values, rho = outcome.values, cand.pools["rho"].to_numpy(float)
    calls: list[tuple[str, SolveResult, float]] = []
    for _ in range(ROUNDS):
        guarded = _guarded_rho(cand, outcome, values, rho)
        if guarded is None:
            break
        result = _solve_fixed(request, cand, outcome, values, guarded, limit, calls)
        if result is None:  # the headroom stays with the flows it was solved for
            break
        rho, values = guarded, result.values
    if not calls or values is outcome.values:
        return cand, outcome
    ms = (time.perf_counter() - began) * 1e3
    new_outcome = dataclasses.replace(
        outcome,
        values=values,
        solve_ms=outcome.solve_ms + ms,
        stages=(*outcome.stages, *stage_records(outcome, calls, "window")),
    )
    return dataclasses.replace(cand, pools=cand.pools.assign(rho=rho)), new_outcome


def optimize_guarded(request: PlanRequest, cand: Candidates, deadline: Deadline | None = None) -> Outcome:
    """optimize(), and for a plan that must serve all its demand (min_cost under the queueing model, a
    churn-limited re-plan too), which the guard cannot give flow up on, on tables whose pools' headroom the
    guard already holds: its classes' requests in one window are their whole demand, so each pool is capped up
    front at the guard's headroom for every use it offers (`prior_tables`: at least as low as for any plan's
    subset of them). Where that leaves no plan, the tables as they are (with what is left of the time limit,
    at least MIN_ROUND_S). Then, as a backstop, again with each pool capped where the guard would lower it for
    the plan found (`capped_tables`) until none falls (at most ROUNDS more solves, all within the request's
    time limit and what `deadline` leaves of it). A capped model without a feasible plan is returned as it is
    (the fleet cannot serve all its demand within the promise: plan() then falls back to max_goodput), but for
    a churn-limited re-plan, where the move limit may be what it cannot meet: there, as for a capped solve
    stopped without a plan, the last plan stays (with its window warnings, `unguarded_warnings`). The capped
    tables ride on the outcome (`candidates`); every solve's calls are in its stages. Under `deadline` the
    first solve gets what is left after the capped tables; without one, the request's whole limit (a short
    min_cost limit would otherwise leave its capped solve no time: session 33's second review)."""
    began = time.perf_counter()
    prior = prior_tables(request, cand)
    first = request
    if deadline is not None:  # the capped tables' time (0.2-0.5 s on generated request 25) is the deadline's
        first = _limited(
            request, max(seconds_left(request.options.time_limit_s, began, deadline), MIN_ROUND_S)
        )
    outcome = optimize(first, cand if prior is None else prior)
    if prior is not None and outcome.termination is Termination.INFEASIBLE:
        # the plan must come from the uncapped tables now: at least MIN_ROUND_S, even past the limit
        left = max(seconds_left(request.options.time_limit_s, began, deadline), MIN_ROUND_S)
        outcome = _joined(outcome, optimize(_limited(request, left), cand), began)
    replan = cand.churn is not None
    for _ in range(ROUNDS):
        capped = capped_tables(request, outcome.candidates, outcome)
        left = seconds_left(request.options.time_limit_s, began, deadline)
        if capped is None or left < MIN_ROUND_S:
            break
        again = optimize(_limited(request, left), capped)
        if again.values is None and (again.termination is not Termination.INFEASIBLE or replan):
            # stopped without a plan, or a re-plan whose move limit the capped tables break: the last plan
            # stays (with its window warnings), the round's calls join its stages
            joined = _joined(outcome, again, began)
            return dataclasses.replace(outcome, stages=joined.stages, solve_ms=joined.solve_ms)
        outcome = _joined(outcome, again, began)
        if again.values is None:
            break
    return outcome


def optimize_or_fall_back(
    request: PlanRequest, cand: Candidates, deadline: Deadline | None = None
) -> tuple[Outcome, bool]:
    """optimize_guarded(), and for a min_cost request the fleet cannot serve (within the promise) the
    max-goodput plan instead, so the user sees what the fleet can do: (outcome, whether it fell back).
    plan() and the what-if points both solve through here. The max-goodput plan gets what is left of the
    time limit (and of `deadline`), at least MIN_ROUND_S."""
    began = time.perf_counter()
    outcome = optimize_guarded(request, cand, deadline)
    if outcome.termination is not Termination.INFEASIBLE or request.options.objective != "min_cost":
        return outcome, False
    left = max(seconds_left(request.options.time_limit_s, began, deadline), MIN_ROUND_S)
    options = msgspec.structs.replace(request.options, objective="max_goodput", time_limit_s=left)
    as_goodput = msgspec.structs.replace(request, options=options)
    return optimize(as_goodput, dataclasses.replace(cand, request=as_goodput)), True


def _limited(request: PlanRequest, seconds: float) -> PlanRequest:
    """`request` with `seconds` (> 0: Options refuses anything else) as its time limit."""
    options = msgspec.structs.replace(request.options, time_limit_s=seconds)
    return msgspec.structs.replace(request, options=options)


def _joined(outcome: Outcome, again: Outcome, began: float) -> Outcome:
    """`again`, with `outcome`'s solver calls ahead of its own (SolverInfo.stages, `again`'s timed on from
    `began`, the first solve's entry) and both solves' time in solve_ms."""
    offset = (time.perf_counter() - began) * 1e3 - again.build_ms - again.solve_ms
    shifted = tuple(msgspec.structs.replace(r, ended_ms=round(r.ended_ms + offset, 3)) for r in again.stages)
    solve_ms = outcome.solve_ms + again.build_ms + again.solve_ms
    return dataclasses.replace(again, stages=(*outcome.stages, *shifted), solve_ms=solve_ms)


def prior_tables(request: PlanRequest, cand: Candidates) -> Candidates | None:
    """For a `min_cost` request under the queueing model (a churn-limited re-plan too): `cand` with each
    prefill and decode pool's headroom at most the guard's for every use it offers, each class's requests
    in one window its whole demand (`headroom.pooled_rho` at one instance), the pools left below
    capacity.RHO_MIN dropped; None where no pool falls."""
    if not _serves_all(request, cand):
        return None
    uses = cand.uses
    rows = np.flatnonzero(uses["role"].isin(["prefill", "decode"]).to_numpy())
    if not len(rows):
        return None
    demand = cand.classes["rate_rps"].to_numpy(float)[uses["w"].to_numpy()[rows]]
    use_rho = pooled_rho(cand, rows, np.ones(len(rows), dtype=np.int64), demand * capacity.WINDOW_MS / 1e3)
    rho = cand.pools["rho"].to_numpy(float)
    lowest = rho.copy()
    np.minimum.at(lowest, uses["pool"].to_numpy()[rows], use_rho)
    return _with_headroom(cand, lowest) if (lowest < rho - 1e-12).any() else None


def _serves_all(request: PlanRequest, cand: Candidates) -> bool:
    """Whether the guard's headroom goes back into the MILP: a min_cost plan under the queueing model,
    churn-limited re-plans among them."""
    options = request.options
    return options.objective == "min_cost" and options.capacity_model == "queueing"


def _with_headroom(cand: Candidates, rho: np.ndarray) -> Candidates:
    """`cand` with its pools' headroom at `rho`, the pools below capacity.RHO_MIN dropped."""
    pools, uses = keep_pools(cand.pools.assign(rho=rho), cand.uses, rho >= capacity.RHO_MIN)
    return dataclasses.replace(cand, pools=pools, uses=uses)


def capped_tables(request: PlanRequest, cand: Candidates, outcome: Outcome) -> Candidates | None:
    """For a `min_cost` plan under the queueing model (a churn-limited re-plan too): `cand` with each
    pool's headroom at most what the guard gives it for this plan (its classes' requests in one window
    are their whole demand), the pools left below capacity.RHO_MIN dropped; None where no pool falls."""
    if not _serves_all(request, cand) or outcome.values is None:
        return None
    caps = _guarded_rho(cand, outcome, outcome.values, cand.pools["rho"].to_numpy(float))
    return None if caps is None else _with_headroom(cand, caps)


def _guarded_rho(
    cand: Candidates, outcome: Outcome, values: np.ndarray, rho: np.ndarray
) -> np.ndarray | None:
    """Each pool's headroom with the guard (steps 1-2) for the plan `values`, or None where none falls."""
    uses = cand.uses
    cols = outcome.columns
    flow = values[cols.use_offset : cols.use_offset + len(uses)]
    rows = np.flatnonzero(uses["role"].isin(["prefill", "decode"]).to_numpy() & (flow > FLOW_EPS))
    if not len(rows):
        return None
    pool = uses["pool"].to_numpy()[rows]
    served = served_by_class(cand, np.where(flow > FLOW_EPS, flow, 0.0))
    window = served[uses["w"].to_numpy()[rows]] * capacity.WINDOW_MS / 1e3
    pooled = cand.pools["pooled"].to_numpy() if "pooled" in cand.pools.columns else np.ones(len(rho))
    servers = np.maximum(pooled[pool], 1).astype(np.int64)
    # screen: the margin falls as the load rises (to within window_margin's grid of indices), so a use whose
    # window holds at its pool's headroom (the most its pool may run) holds at any load the LP gives it
    t, curves = pool_queues(cand, rows, servers)
    t = dataclasses.replace(t, window=window)
    binds = capacity.use_window_epsilon(t, curves, rho[pool] * t.rate) < t.epsilon
    if not binds.any():
        return None
    rows, pool, servers, window = rows[binds], pool[binds], servers[binds], window[binds]
    use_rho = pooled_rho(cand, rows, servers, window)
    lowest = rho.copy()
    np.minimum.at(lowest, pool, use_rho)
    return lowest if (lowest < rho - 1e-12).any() else None


def guard_applies(request: PlanRequest, cand: Candidates) -> bool:
    """Whether the guard applies: a max_goodput plan under the queueing model, and a max_min_fraction one,
    which gives flow up as a smaller common fraction phi (`_solve_fixed`), churn-limited re-plans among
    them (the guard moves no instance). A min_cost plan must serve all its demand (`optimize_guarded`)."""
    options = request.options
    return options.capacity_model == "queueing" and options.objective in ("max_goodput", "max_min_fraction")


def _solve_fixed(
    request: PlanRequest,
    cand: Candidates,
    outcome: Outcome,
    values: np.ndarray,
    rho: np.ndarray,
    limit: float,
    calls: list[tuple[str, SolveResult, float]],
) -> SolveResult | None:
    """Step 3: the LP with every integer column fixed at the plan's, every pool's capacity row at `rho`
    (the credit's or the guard's: the MILP's form has its own), flow only on the uses that carry it in the
    plan `values` (it may shift among them, never to another: each use's headroom was computed for the
    uses its pool carries), each flow bounded by its class's demand (the capacity rows bound the rest once
    x is fixed), and no lexicographic lock (`_unlocked`): goodput; for max_min_fraction phi first, then
    goodput with phi locked (`_fair_stage`). None when it finds no plan. Each LP joins `calls`."""
    cols = outcome.columns
    integers = np.round(values)
    flow = values[cols.use_offset : cols.use_offset + len(cand.uses)]
    every = np.ones(len(rho), dtype=bool)
    form = fixed_form(outcome.form, cols, integers, rho, every, flow <= FLOW_EPS, use_demand(cand))
    form = _unlocked(form, cols)
    options = request.options
    if options.objective == "max_min_fraction":
        form = _fair_stage(cand, form, flow > FLOW_EPS, rho, options, limit, calls)
        if form is None:
            return None
    return fixed_lp(form, "goodput", options, limit, calls)


def _fair_stage(
    cand: Candidates,
    form: MatrixForm,
    carrying: np.ndarray,
    rho: np.ndarray,
    options,
    limit: float,
    calls: list[tuple[str, SolveResult, float]],
) -> MatrixForm | None:
    """A max_min_fraction plan's first stage on fixed instances: the largest common fraction phi, then
    `form` with phi locked there. A class the guard leaves no route for (`_stranded`) drops out of the
    fairness rows, as the MILP leaves out a class no pool can serve (formulation.define_fairness): it
    would pin phi at 0 for every other class."""
    stranded = _stranded(cand, carrying, rho)
    if stranded.any():
        _, begin, _ = next(block for block in form.row_blocks if block[0] == "fairness")
        row_lo = form.row_lo.copy()
        row_lo[begin + np.flatnonzero(stranded)] = -np.inf
        form = dataclasses.replace(form, row_lo=row_lo)
    result = fixed_lp(form, "phi", options, limit, calls)
    if result is None or result.objective is None:
        return None
    return lock_stage(form, "phi", Sense.MAX, result.objective)


def _stranded(cand: Candidates, carrying: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """Per class: whether every route it carries flow on runs through a pool at 0 headroom (no load keeps
    that pool's window): none of its colocated uses, or none of its prefill or none of its decode uses,
    left with headroom."""
    uses = cand.uses
    open_use = carrying & (rho[uses["pool"].to_numpy()] > 0)
    w, role = uses["w"].to_numpy(), uses["role"].to_numpy()
    n = len(cand.classes)

    def has(kind: str, among: np.ndarray) -> np.ndarray:
        return np.bincount(w[among & (role == kind)], minlength=n) > 0

    colocated = has("colocated", open_use)
    split = has("prefill", open_use) & has("decode", open_use)
    served_before = has("colocated", carrying) | has("prefill", carrying)
    return served_before & ~(colocated | split)


def _unlocked(form: MatrixForm, cols) -> MatrixForm:
    """`form` without its lexicographic locks (optimize.py's `lock_<stage>` rows: the tie-break's form holds
    goodput at the MILP's value, which the guard gives up on purpose) and without what the one-solve
    tie-break adds (`optimize.fold_stages`: every demand row an equality and phi fixed at 1, so that the
    guard's lower headroom left its LP without a plan and the plan kept the MILP's; session 33): the demand
    rows as `formulation.define_demand` writes them for a plan that may serve less, phi in [0, 1]."""
    row_lo, row_hi = form.row_lo.copy(), form.row_hi.copy()
    for name, start, end in form.row_blocks:
        if name.startswith("lock_"):
            row_lo[start:end], row_hi[start:end] = -np.inf, np.inf
        elif name == "demand":
            row_lo[start:end] = -np.inf
    col_lo = form.col_lo
    if cols.has_phi:
        col_lo = col_lo.copy()
        col_lo[cols.phi] = 0.0
    return dataclasses.replace(form, row_lo=row_lo, row_hi=row_hi, col_lo=col_lo)


def unguarded_warnings(request: PlanRequest, cand: Candidates, outcome: Outcome | None) -> list[str]:
    """Where the guard did not hold (a `min_cost` plan under the queueing model whose rounds of
    `optimize_guarded` ran out first, a churn-limited `min_cost` re-plan whose move limit the capped tables
    would break, or a guarded plan whose `window_guard` LP stopped without a plan or whose rounds ended), one
    warning per pool that runs above the headroom the guard would give it: the plan keeps the MILP's, and
    one judged window may break the classes that pool carries more than WINDOW_DELTA of the time."""
    if outcome is None or outcome.values is None or request.options.capacity_model != "queueing":
        return []
    rho = cand.pools["rho"].to_numpy(float)
    guarded = _guarded_rho(cand, outcome, outcome.values, rho)
    if guarded is None:
        return []
    uses, cols = cand.uses, outcome.columns
    flow = np.maximum(outcome.values[cols.use_offset : cols.use_offset + len(uses)], 0.0)
    pool = uses["pool"].to_numpy()
    x = np.round(outcome.values[: cols.n_pools])
    running = np.divide(capacity_used(cand, flow), x, out=np.zeros(len(rho)), where=x > 0)
    names = [w.name for w in request.workloads]
    why = _GUARD_STOPPED if guard_applies(request, cand) else _GUARD_NOT_APPLIED
    return [
        _window_warning(
            cand.pools.iloc[p],
            running[p],
            guarded[p],
            names,
            uses["w"].to_numpy()[pool == p],
            flow[pool == p],
        )
        + why
        for p in np.flatnonzero(running > guarded + 1e-9)
    ]


_GUARD_NOT_APPLIED = (
    " (the window guard did not apply: a min_cost plan's re-solves stop after four rounds, at the time "
    "limit, or where a re-plan's max_moves leaves no plan on the guard's headroom)"
)
_GUARD_STOPPED = (
    " (the window guard stopped before it held: its four rounds ended, or its LP ran out of time)"
)


def _window_warning(
    pool, running: float, guarded: float, names: list[str], w: np.ndarray, flow: np.ndarray
) -> str:
    carried = ", ".join(sorted({names[k] for k in w[flow > FLOW_EPS]}))
    above = "at any load" if guarded <= 0 else f"above {guarded:.3f} of it"
    where = f"{pool['owner']} {pool['role']} pool on {pool['device']} (batch {pool['batch']})"
    return (
        f"window: the {where} runs at {running:.3f} of its full-batch rate; {above}, one 600 s window may "
        f"break {carried} more than {scatter.WINDOW_DELTA:.0%} of the time"
    )
