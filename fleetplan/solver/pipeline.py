"""plan(request) -> Plan: the single entry point the API, the CLI and the tests call.

decode (done by the caller) -> profile lookup -> candidates -> formulation -> backend -> extract ->
explain -> baselines -> verify.
"""

import dataclasses
import math
import time

import msgspec
import numpy as np

from fleetplan.models.errors import DeadlineExceeded, ProfileMissing, SolverFailure
from fleetplan.models.plan import Baselines, Plan, PlanRequest, ProfileSetInfo, SolverInfo, WorkloadResult
from fleetplan.models.workload import Workload
from fleetplan.profiler.store import ProfileStore
from fleetplan.profiler.tables import ProfileTable, from_rows
from fleetplan.solver import baselines, explain, extract
from fleetplan.solver.backends import Termination, relative_gap
from fleetplan.solver.candidates import Candidates, build_candidates, check_profiles_cover
from fleetplan.solver.deadline import CANDIDATES, SOLVE, Deadline, after_solve_s, holding, seconds_left
from fleetplan.solver.formulation import Churn, pool_cost, pool_keys, previous_by_key
from fleetplan.solver.memo import per_table
from fleetplan.solver.optimize import Outcome
from fleetplan.solver.verify import verify
from fleetplan.solver.window import guard_applies, optimize_or_fall_back, settle, unguarded_warnings

# the least time limit worth giving the main solve under a deadline (less: DeadlineExceeded at once)
MIN_SOLVE_S = 0.05
_STATUS = {
    Termination.OPTIMAL: "optimal",
    Termination.FEASIBLE: "feasible",
    Termination.INFEASIBLE: "infeasible",
}


def resolve_profiles(request: PlanRequest, store: ProfileStore | None = None) -> ProfileTable:
    """The table a request names: inline rows, or a set from the store (bundled sets by default)."""
    if request.profiles.rows is not None:
        return from_rows(request.profiles.rows)
    assert request.profiles.set is not None
    return (store or ProfileStore()).load(request.profiles.set)


@per_table
def _covered(table: ProfileTable) -> set[tuple[str, int]]:
    """The (model, percentile) pairs `table` was seen to cover; check_cover adds to it (the one mutable
    value of solver/memo.py's caches)."""
    return set()


def check_cover(request: PlanRequest, table: ProfileTable) -> None:
    """candidates.check_profiles_cover, on the first class of each (model, percentile) not yet seen
    covered by this table (its cost grows with classes x rows); on a failure the whole request is checked
    again, so that the error names the first class at fault."""
    firsts: dict[tuple[str, int], Workload] = {}
    for w in request.workloads:
        firsts.setdefault((w.model, w.slo.percentile), w)
    covered = _covered(table)
    unseen = [w for pair, w in firsts.items() if pair not in covered]
    if not unseen:
        return
    try:
        check_profiles_cover(msgspec.structs.replace(request, workloads=unseen), table)
    except ProfileMissing:
        check_profiles_cover(request, table)
        raise
    covered.update(firsts)


def plan(
    request: PlanRequest,
    store: ProfileStore | None = None,
    *,
    with_baselines: bool = True,
    churn: Churn | None = None,
    deadline: Deadline | None = None,
) -> Plan:
    """Plan a fleet; raises a PlannerError subclass on bad input or when the solver gives no plan.

    `churn` (internal, the re-plan's): the plan in force, a limit on instances moved and a penalty per move
    (formulation.define_churn); the plan in force is then also the solver's start.
    `deadline` (solver/deadline.py) is checked between stages and caps the solver's time limit, so that
    the whole call, not only the solve, keeps to the caller's wall-clock budget.
    """
    began = time.perf_counter()
    table, cand = _candidates(request, store, churn, deadline)
    # the main solve leaves what the window guard (where it applies), the plan's assembly, baselines and
    # verification need
    window_s, rest_s = after_solve_s(len(cand.uses))
    solving = holding(deadline, rest_s + (window_s if guard_applies(request, cand) else 0.0))
    outcome, status = _solve(_within(request, cand, solving), cand, solving)
    if outcome is not None:
        # the candidates (and request) the outcome solved: a min_cost request the fleet cannot serve is
        # settled and extracted as the max_goodput plan it falls back to
        cand = outcome.candidates
        cand, outcome = settle(cand.request, cand, outcome, deadline, fell_back=status == "infeasible")
    _check(deadline, "the solve")
    result = _assemble(request, table, cand, outcome, status)
    if with_baselines:
        remaining = seconds_left(request.options.time_limit_s, began, deadline)
        base = Baselines(gpu_only=baselines.gpu_only(cand, remaining), greedy=baselines.greedy(cand))
        result = msgspec.structs.replace(result, baselines=base)
    verify(request, result, table)
    _check(deadline, "verification")
    if request.verify == "simulate" and status in ("optimal", "feasible"):
        from fleetplan.simulator import simulate

        result = msgspec.structs.replace(result, simulation=simulate(request, result, table))
    return result


def _candidates(
    request: PlanRequest, store: ProfileStore | None, churn: Churn | None, deadline: Deadline | None
) -> tuple[ProfileTable, Candidates]:
    """The request's profile table (its cover checked) and its candidate tables."""
    table = resolve_profiles(request, store)
    check_cover(request, table)
    _check(deadline, "the profile lookup")
    _enter(deadline, CANDIDATES)
    cand = build_candidates(request, table)
    _enter(deadline, SOLVE)
    if churn is not None:
        cand = dataclasses.replace(cand, churn=churn)
    _check(deadline, "candidate generation")
    return table, cand


def _assemble(
    request: PlanRequest, table: ProfileTable, cand: Candidates, outcome: Outcome | None, status: str
) -> Plan:
    """The Plan of a settled outcome (None: nothing to serve with), its baselines not yet added."""
    values = outcome.values if outcome else None
    solution = _solution(cand, outcome, values)
    groups = extract.pool_groups(cand, solution)
    routes = extract.routes_out(cand, solution, groups) if outcome else {w: [] for w in cand.classes.index}
    devices = extract.devices_out(cand, solution)
    links = extract.links_out(cand, routes)
    cost = float(sum(d.cost_per_hour * u.used for d, u in zip(request.devices, devices, strict=True)))
    results = _workload_results(cand, routes, devices, links, cost, solution, table)
    bound, gap = _bound_and_gap(outcome, request)
    unit, objective_value, objective_bound = _objective(outcome, request, results)
    return Plan(
        status=status,  # type: ignore[arg-type]
        objective=request.options.objective,
        slo_rps=round(sum(r.served_rps for r in results), 9),
        demand_rps=float(cand.classes["rate_rps"].sum()),
        bound_rps=bound,
        mip_gap=gap,
        cost_per_hour=round(cost, 9),
        workloads=results,
        pools=extract.pools_out(cand, solution, groups),
        devices=devices,
        links=links,
        baselines=None,
        solver=_solver_info(request, outcome),
        profile_set=ProfileSetInfo(name=table.name, sha256=table.sha256),
        warnings=[
            *explain.profile_warnings(request, table),
            *explain.interpolation_warnings(request, results, table),
            *unguarded_warnings(cand.request, cand, outcome),
        ],
        kv_budget_headroom=cand.link_rho.get(None),
        objective_unit=unit,
        objective_value=objective_value,
        objective_bound=objective_bound,
    )


def _check(deadline: Deadline | None, stage: str) -> None:
    if deadline is not None:
        deadline.check(stage)


def _enter(deadline: Deadline | None, stage: str) -> None:
    if deadline is not None:
        deadline.enter(stage)


def _within(request: PlanRequest, cand: Candidates, deadline: Deadline | None) -> PlanRequest:
    """The request the optimizer sees: its time limit capped by what remains of the deadline, less what
    the work after the solve needs (`deadline.reserve_s`). Raises DeadlineExceeded when that leaves the
    solver less than MIN_SOLVE_S: the plan could not be assembled in time, whatever the solver found."""
    if deadline is None or cand.uses.empty:
        return request
    room = deadline.solver_time_limit(math.inf)  # the deadline's, whatever the request asks
    if room < MIN_SOLVE_S:
        msg = (
            f"no plan within time_limit_s={deadline.budget_s:g} (the budget ran out after candidate "
            f"generation: {max(deadline.remaining(), 0):.2f} s were left, and the work after the solve needs "
            f"about {deadline.reserve_s:.2f} s for this request's {len(cand.uses):,} candidate uses); raise "
            "time_limit_s or shrink the request"
        )
        raise DeadlineExceeded(msg, field="options.time_limit_s")
    limit = min(request.options.time_limit_s, room)
    if limit >= request.options.time_limit_s:
        return request
    return msgspec.structs.replace(
        request, options=msgspec.structs.replace(request.options, time_limit_s=limit)
    )


def _solve(request: PlanRequest, cand, deadline: Deadline | None = None) -> tuple[Outcome | None, str]:
    """The outcome to report and its status (window.optimize_guarded: a min_cost plan is solved on tables
    capped at the window guard's headroom); a min_cost request the fleet cannot serve (within the promise)
    gets the max-goodput plan, reported as infeasible, so the user sees what the fleet can do instead."""
    if cand.uses.empty:
        return None, "no_candidates"
    outcome, fell_back = optimize_or_fall_back(request, cand, deadline)
    if fell_back:
        return outcome, "infeasible"
    if outcome.values is None:
        failure = SolverFailure(_no_plan_message(request, outcome, deadline), field="options.time_limit_s")
        failure.proven_infeasible = outcome.termination is Termination.INFEASIBLE  # more time finds nothing
        raise failure
    return outcome, _STATUS[outcome.termination]


def _no_plan_message(request: PlanRequest, outcome: Outcome, deadline: Deadline | None) -> str:
    """Why the solver gave no plan: within the request's time limit, or within what its deadline left."""
    options = request.options
    within = f"within time_limit_s={options.time_limit_s:g}"
    if deadline is not None and options.time_limit_s < deadline.budget_s:
        within = (
            f"in the {options.time_limit_s:.2f} s that time_limit_s={deadline.budget_s:g} left the solve "
            "(after candidate generation, less what the work after the solve needs)"
        )
    if outcome.termination is Termination.INFEASIBLE:
        return (
            f"solver {options.solver} proved that no plan meets the request's constraints (infeasible); more "
            "time will not find one"
        )
    return (
        f"solver {options.solver} found no plan ({outcome.termination}) {within}; raise the time limit or "
        "shrink the candidate set"
    )


def _solution(cand, outcome, values) -> extract.Solution:
    if outcome is None or values is None:
        n_pools, n_uses = len(cand.pools), len(cand.uses)
        return extract.Solution(np.zeros(n_pools, np.int64), np.zeros(n_uses), np.zeros(n_pools))
    solution = extract.solution_from(cand, outcome.columns, values)
    return solution if cand.churn is None else _kept_instances(cand, outcome.columns, values, solution)


def _kept_instances(cand, cols, values, solution: extract.Solution) -> extract.Solution:
    """Under churn the solver may keep an instance of the plan in force that no load needs (removing it
    would be a move): keep what it chose, up to the instances in force; idle ones added are still dropped.
    Counted per key (owner, role, device, tp, batch), as the churn rows count moves (define_churn): the
    MILP may keep an instance in force at another headroom level of its key than the one
    previous_instances gives it. Counted per pool column, such an instance was dropped, a move the
    churn limit did not allow (paper.json at 1.25x its demand, max_moves 4: 5 moves)."""
    x = np.round(values[: cols.n_pools]).astype(np.int64)
    keys = pool_keys(cand)
    n_keys = int(keys.max(initial=-1)) + 1
    chosen = np.bincount(keys, weights=x, minlength=n_keys)
    have = np.bincount(keys, weights=solution.instances, minlength=n_keys)
    in_force = np.round(previous_by_key(cand)[0])
    missing = np.maximum(np.minimum(chosen, in_force) - have, 0).astype(np.int64)
    instances = solution.instances.copy()
    spare = np.maximum(x - instances, 0)
    for key in np.flatnonzero(missing):  # keys with an instance in force dropped: a handful at most
        for col in np.flatnonzero((keys == key) & (spare > 0)):
            add = min(int(spare[col]), int(missing[key]))
            instances[col] += add
            missing[key] -= add
    return dataclasses.replace(solution, instances=instances)


def _workload_results(cand, routes, devices, links, cost, solution=None, table=None) -> list[WorkloadResult]:
    """Served, unserved and why, per class; the solution's `dropped` (RPS per class extract dropped for
    running through pools with 0 instances) and `slivers` are unserved, and the reason says so."""
    classes = cand.classes
    demand = classes["rate_rps"].to_numpy(float)
    served = np.array([sum(r.rps for r in routes[w]) for w in classes.index], dtype=float)
    unserved = np.maximum(demand - served, 0.0)
    short = unserved > 1e-6 * np.maximum(1.0, demand)
    with_uses = set(cand.uses["w"].to_numpy().tolist())
    reasons: dict[int, str | None] = {w: None for w in classes.index}
    reasons.update(
        {w: explain.no_candidate_reason(cand, w, table) for w in classes.index[short] if w not in with_uses}
    )
    reasons.update(
        explain.shortfall_reasons(
            cand, [w for w in classes.index[short] if w in with_uses], devices, links, cost
        )
    )
    if solution is not None:
        for w in classes.index[solution.dropped > 0] if solution.dropped is not None else []:
            reasons[w] = explain.with_dropped_flow(reasons[w], float(solution.dropped[w]))
        for w in classes.index[solution.slivers] if solution.slivers is not None else []:
            reasons[w] = explain.with_sliver(reasons[w], extract.WINDOW_S, extract.MIN_TAIL_REQUESTS)
    return [
        WorkloadResult(
            name=name,
            served_rps=round(float(s), 9),
            unserved_rps=round(float(u), 9),
            reason=reasons[w],
            routes=routes[w],
        )
        for w, name, s, u in zip(classes.index, classes["name"], served, unserved, strict=True)
    ]


def _solver_info(request: PlanRequest, outcome) -> SolverInfo:
    if outcome is None:
        return SolverInfo(
            backend=request.options.solver, build_ms=0.0, solve_ms=0.0, termination="no candidates"
        )
    form = outcome.form
    return SolverInfo(
        backend=request.options.solver,
        build_ms=round(outcome.build_ms, 3),
        solve_ms=round(outcome.solve_ms, 3),
        variables=int(form.A.shape[1]),
        integers=int(form.integer.sum()),
        rows=int(form.A.shape[0]),
        nonzeros=form.nonzeros,
        lp_bound=outcome.lp_bound,
        termination=str(outcome.termination),
        tie_break=outcome.tie_break,
        stages=list(outcome.stages),
        tie_break_gap=outcome.tie_break_gap,
    )


def _bound_and_gap(outcome, request: PlanRequest) -> tuple[float | None, float | None]:
    """The proven bound on goodput in RPS (only where the primary objective is unweighted goodput: under
    weights the solver bounds sum_w weight_w * served_w, see _objective) and the primary stage's gap."""
    if outcome is None:
        return 0.0, 0.0
    value, bound = outcome.primary_value, outcome.primary_bound
    if value is None or bound is None:
        return None, None
    gap = relative_gap(value, bound)
    solved = outcome.candidates.request
    in_rps = solved.options.objective == "max_goodput" and all(w.weight == 1 for w in solved.workloads)
    return (bound if in_rps else None), gap


def _objective(
    outcome, request: PlanRequest, results: list[WorkloadResult]
) -> tuple[str, float | None, float | None]:
    """The primary objective solved (the max-goodput fallback of an infeasible min_cost request), in its
    own units: its unit, the plan's value (goodput: recomputed from the served RPS) and the proven bound."""
    solved = request if outcome is None else outcome.candidates.request
    weights = {w.name: w.weight for w in solved.workloads}
    objective = solved.options.objective
    if objective == "max_goodput":
        unit = "rps" if all(v == 1 for v in weights.values()) else "weighted_rps"
    elif objective == "max_min_fraction":
        unit = "min_fraction"
    else:
        # the cost stage counts devices when no candidate pool has a price (formulation.objective_vectors)
        if outcome is None:
            priced = any(d.cost_per_hour > 0 for d in solved.devices)
        else:
            priced = bool(pool_cost(outcome.candidates).any())
        unit = "cost_per_hour" if priced else "devices"
    if outcome is None:  # no candidates: nothing can be served, and that is proven
        nothing = None if unit in ("cost_per_hour", "devices") else 0.0
        return unit, nothing, nothing
    value = outcome.primary_value
    if unit in ("rps", "weighted_rps"):
        value = round(sum(weights[r.name] * r.served_rps for r in results), 9)
    elif unit == "min_fraction":
        value = _min_fraction(outcome.candidates, results, value)
    return unit, value, outcome.primary_bound


def _min_fraction(cand, results: list[WorkloadResult], milp_value: float | None) -> float | None:
    """The plan's own phi: the least share of its demand any class with demand and a candidate gets (the
    classes formulation.define_fairness counts). The MILP's phi until the window guard gives flow up, which
    lowers it (and serving every class in full, window.in_full_guarded, takes it to 1)."""
    servable = set(cand.classes["name"].to_numpy()[cand.uses["w"].unique()])
    fractions = [
        r.served_rps / (r.served_rps + r.unserved_rps)
        for r in results
        if r.name in servable and r.served_rps + r.unserved_rps > 0
    ]
    return round(min(fractions), 9) if fractions else milp_value
