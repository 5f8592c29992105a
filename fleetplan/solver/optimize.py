"""Solve the MILP lexicographically: primary objective, then each tie-break with the previous optimum locked.

optimize() runs these steps, one function each:

1. build_model: the matrix form of the candidates (formulation.matrix_for: build_matrix, built once per
   request but for its budget and kept with the candidate tables).
2. relax_stages: the LP relaxation through every stage, each optimum locked for the next (only the first
   on a large instance, is_large). Its first value is the reported LP bound.
3. primal_start: an incumbent for the full MIP. HiGHS alone struggles to find incumbents on this model (it
   spends its time on root cuts while the LP bound is already nearly tight), so a RENS-style sub-MIP:
   every x is boxed between the floor of the smallest and the ceiling of the largest value it takes in the
   LP solutions (the max-goodput LP spreads over device types, the min-cost LP packs them; together they
   span good integer plans), which leaves a small MIP that HiGHS solves in a fraction of the time; a
   neighbouring plan given as a hint (a what-if point's own plan, for its marginal values) widens that
   box. Where it stops before its box's optimum, the best of its incumbent, the greedy baseline's plan
   (_greedy_start) and, if it found nothing, the economical LP rounded within the devices, each with its
   flows re-solved with x fixed.
3b. search_neighbourhoods: on instances whose full MIP cannot end its root node in the time limit (one LP
   relaxation taking LNS_LP_S or more, is_large), sub-MIPs around the start that free part of its
   instances (solver/neighbourhood.py) first improve it.
4. solve_primary: the full MIP of the first stage, seeded with that start through setSolution.
5. tie_break: each further stage with the previous one's objective locked, warm-started from its plan.
6. assign_outcome: the Outcome the pipeline reads, with a StageRecord per solver call (step, objective,
   kind, ms, termination, objective value, bound, gap, nodes) for SolverInfo.stages and the bench.

A finished stage is locked at its value less a 1e-9 relative slack, not the whole MIP gap: a cost
tie-break must not buy its savings with goodput (a class would show a sliver "unserved").
Tie-break stages and the sub-MIP each get at most a share of the time limit; what they reach is reported.
"""

import time
from dataclasses import dataclass, field, replace

import numpy as np

from fleetplan.models.plan import Options, PlanRequest, StageRecord, StageStep
from fleetplan.solver.backends import Sense, SolveResult, Termination, get_backend, relative_gap
from fleetplan.solver.backends.base import Backend
from fleetplan.solver.baselines import greedy_run
from fleetplan.solver.candidates import Candidates
from fleetplan.solver.formulation import (
    Columns,
    MatrixForm,
    budget_binds,
    budget_row,
    device_use_row,
    matrix_for,
    previous_instances,
    servable_demand,
    switch_values,
)
from fleetplan.solver.neighbourhood import improve

# The lexicographic stages of each objective (docs/formulation.md, "Objectives"): (objective vector, sense).
STAGES = {
    "max_goodput": [("goodput", Sense.MAX), ("cost", Sense.MIN)],
    "min_cost": [("cost", Sense.MIN)],
    "max_min_fraction": [("phi", Sense.MAX), ("goodput", Sense.MAX), ("cost", Sense.MIN)],
}
# A finished stage is locked at its value less this relative slack (of max(1, |value|)): round-off only,
# not the MIP gap, so a cost tie-break never buys its savings with goodput.
LOCK_SLACK = 1e-9
# Each tie-break stage may use at most this share of options.time_limit_s.
TIE_BREAK_SHARE = 0.3
# The sub-MIP of the primal start may use at most this share of options.time_limit_s.
SUB_MIP_SHARE = 0.3
# Each LP relaxation after the first (only the sub-MIP's box and the fold read them) may use at most this
# share: on L the min-cost LP with goodput locked took 8 s of a 10 s limit on a loaded machine.
LATER_RELAXATION_SHARE = 0.2
# HiGHS options per solver call, on top of the backend's own (docs/solvers.md, "HiGHS options" has the
# measurements behind each): keyed by (step, stage), then by step; a call with no entry runs at the defaults.
STAGE_TUNING: dict[tuple[str, str] | str, dict[str, bool | int | float | str]] = {
    "relaxation": {"presolve": "off"},
    "primary": {"mip_heuristic_run_rins": False},
    # the cost MIP with every class served in full: min_cost's first stage and the folded tie-break
    ("primary", "cost"): {"presolve": "off"},
    "tie_break": {"presolve": "off", "mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False},
}
# Laid over STAGE_TUNING, per step, when the request's budget may bind (below the fleet's cost:
# formulation.budget_binds; docs/solvers.md, "Per call"): under a binding budget the tie-break's presolve
# pays again.
BUDGET_TUNING: dict[str, dict[str, bool | int | float | str]] = {
    "tie_break": {"presolve": "choose"},
}
# Laid over both, per step, on a search with a cutoff (optimize_above: only plans above a floor count):
# RENS's plans around the LP solution mostly fall below it (docs/solvers.md, "Per call").
CUTOFF_TUNING: dict[str, dict[str, bool | int | float | str]] = {
    "primary": {"mip_heuristic_run_rens": False},
}
# A large instance (is_large: neighbourhood search, step 3b, and no LP relaxation after the first) is one
# whose first LP relaxation took at least this many seconds: measured 0.40-1.0 s on the L bench instances,
# where the full MIP ends no node in 10 s (nor in 55 s), against 23-41 ms on M and 3 ms on paper.json,
# where it branches. A share of the time limit instead (2%) took M at a 1 s limit for large, where the
# search lost to the full MIP on 3 of 5 seeds (docs/solvers.md, "Neighbourhoods on large instances").
LNS_LP_S = 0.2
# ... until this share of the time limit has passed (the full MIP's root then takes the bound down), each
# sub-MIP at most LNS_CALL_SHARE of it.
LNS_UNTIL = 0.6
LNS_CALL_SHARE = 0.1
# ... but only where the full MIP's share (1 - LNS_UNTIL of the time limit) is at least ROOT_LPS times the
# first LP relaxation: with less, its presolve, root LP and cuts leave the LP's bound where it was, and the
# search makes more of the time; it then runs until LNS_LAST of the time limit (session 32, docs/solvers.md
# "Neighbourhoods on large instances": L at 10 s, five seeds, and L at 30 s, two).
ROOT_LPS = 5.0
LNS_LAST = 0.95
# The stage whose start may come from the greedy baseline's instances (primal_start, _greedy_start): the
# baseline serves what it can, so only a goodput maximization can use it.
GREEDY_STAGE = ("goodput", Sense.MAX)
# ... where at least this share of the time limit is left (greedy_run: 46 ms on paper.json, 0.4 s on L).
GREEDY_SHARE = 0.05
# The least time limit a solver call is given, even once the deadline has passed (s).
MIN_CALL_S = 0.01
# LP values within this of an integer count as that integer when flooring and ceiling them.
INTEGRALITY_TOL = 1e-9
# rounded_start adds an instance to a pool only where the LP's fractional part exceeds this.
MIN_ROUND_UP = 1e-6
# rounded_start keeps the spend within the model's budget (formulation.budget_row) plus this (round-off).
BUDGET_TOL = 1e-9


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
    stages: tuple[StageRecord, ...] = ()  # every solver call, in order
    tie_break_gap: float | None = None  # the last tie-break stage's own relative_gap


@dataclass(frozen=True)
class _Clock:
    """One optimize() call's time budget: options.time_limit_s from its entry, over every stage."""

    options: Options
    began: float
    deadline: float

    @classmethod
    def start(cls, options: Options) -> "_Clock":
        began = time.perf_counter()
        return cls(options, began, began + options.time_limit_s)

    def remaining(self) -> float:
        return max(self.deadline - time.perf_counter(), MIN_CALL_S)

    def share(self, fraction: float) -> float:
        """At most `fraction` of the time limit, and no more than remains."""
        return min(self.remaining(), fraction * self.options.time_limit_s)

    def passed(self) -> bool:
        return time.perf_counter() >= self.deadline


@dataclass(frozen=True)
class _Solver:
    """The backend, the clock, and a StageRecord for every call made through call()."""

    backend: Backend
    clock: _Clock
    records: list[StageRecord] = field(default_factory=list)
    # a first-stage value the start's sub-MIP and the primary MIP must beat (optimize_above): HiGHS prunes
    # every node whose bound does not (its objective_bound, in HiGHS's minimizing sense); None: no cutoff
    cutoff: tuple[float, Sense] | None = None
    # whether the model's budget may bind (formulation.budget_binds): BUDGET_TUNING's condition, read off
    # the model, so that every request of one model (no budget, or any budget from the fleet's cost up)
    # gets the same solver calls
    budgeted: bool = False

    def call(
        self,
        step: StageStep,
        stage: str,
        form: MatrixForm,
        objective: np.ndarray,
        sense: Sense,
        **kwargs,
    ) -> SolveResult:
        """backend.solve(form, objective, sense, **kwargs), recorded."""
        began = time.perf_counter()
        tuning = STAGE_TUNING.get((step, stage), STAGE_TUNING.get(step))
        if self.budgeted and step in BUDGET_TUNING:
            tuning = {**(tuning or {}), **BUDGET_TUNING[step]}
        if self.cutoff is not None and step in ("start", "primary"):
            value, cutoff_sense = self.cutoff
            bound = -value if cutoff_sense is Sense.MAX else value
            tuning = {**(tuning or {}), **CUTOFF_TUNING.get(step, {}), "objective_bound": bound}
        result = self.backend.solve(form, objective, sense, tuning=tuning, **kwargs)
        ended = time.perf_counter()
        integer = bool(form.integer.any()) and not kwargs.get("relax", False)
        kind = "submip" if step in ("start", "neighbourhood") and integer else "mip" if integer else "lp"
        self.records.append(
            StageRecord(
                step=step,
                stage=stage,
                kind=kind,
                ms=round((ended - began) * 1e3, 3),
                ended_ms=round((ended - self.clock.began) * 1e3, 3),
                termination=str(result.termination),
                objective=result.objective,
                bound=result.bound,
                gap=relative_gap(result.objective, result.bound),
                nodes=result.nodes,
            )
        )
        return result


@dataclass(frozen=True)
class _Model:
    """What build_model makes and every later step reads."""

    cand: Candidates
    form: MatrixForm
    cols: Columns
    build_ms: float


@dataclass(frozen=True)
class _Final:
    """Where the stages ended: the form with every finished stage locked, the last result kept."""

    form: MatrixForm
    result: SolveResult
    tie_break: str | None
    tie_break_gap: float | None = None  # relative_gap of the last tie-break stage kept


def optimize(
    request: PlanRequest,
    cand: Candidates,
    stages: list[tuple[str, Sense]] | None = None,
    hint: np.ndarray | None = None,
) -> Outcome:
    """Build and solve within options.time_limit_s (over all stages): the steps of the module docstring.
    `hint`, a neighbouring plan on the same columns that need not be feasible here, widens the sub-MIP's
    box (primal_start)."""
    clock = _Clock.start(request.options)
    return _solve(build_model(cand, clock), stages or STAGES[request.options.objective], clock, hint)


def optimize_fixed(request: PlanRequest, cand: Candidates, fixed: dict[int, float]) -> Outcome:
    """optimize() with each column of `fixed` (column number -> value) held at its value: the model's best
    plan on a fleet given elsewhere (bench/uniform_gap.py holds the instance columns at another plan's)."""
    clock = _Clock.start(request.options)
    model = build_model(cand, clock)
    columns = np.fromiter(fixed, dtype=np.int64, count=len(fixed))
    values = np.fromiter(fixed.values(), dtype=float, count=len(fixed))
    held = _Model(cand, model.form.with_fixed(columns, values), model.cols, model.build_ms)
    return _solve(held, STAGES[request.options.objective], clock, None)


def optimize_above(
    request: PlanRequest,
    cand: Candidates,
    floor: float,
    more_than: tuple[str, int],
    hint: np.ndarray | None = None,
) -> tuple[Outcome | None, bool]:
    """optimize() over the plans that use more than `more_than = (device type, n)` devices of that type
    and whose first stage exceeds `floor` (max_goodput only: its first stage is maximized), and whether
    the MIP ran. None where no plan does: the LP relaxation of those plans (a bound on each) is
    infeasible or at most `floor` (no MIP), or the MIP, which prunes every node whose bound does not
    exceed `floor` (a cutoff, not a row: the LP stays as it is), finds none. A `hint` widens the start's
    sub-MIP box as in optimize().

    A what-if point's marginal value of one more device (whatif.point.PointSolver.one_more_device): the
    request with it has its optimum either among the plans that use it or among the point's own plans;
    with `floor` the point's value, None means the point's plan is optimal there too, and an Outcome is
    that request's optimum (and its cost tie-break) (docs/whatif.md, "Marginal values")."""
    stages = STAGES[request.options.objective]
    if stages[0][1] is not Sense.MAX:
        raise ValueError(f"optimize_above bounds a maximized first stage; {request.options.objective} is not")
    clock = _Clock.start(request.options)
    built = build_model(cand, clock)
    device, n = more_than
    form = built.form.with_row(f"more_{device}", device_use_row(cand, built.cols, device), n + 1, np.inf)
    model = _Model(cand, form, built.cols, built.build_ms)
    solver = _Solver(
        get_backend(clock.options.solver), clock, cutoff=(floor, Sense.MAX), budgeted=budget_binds(request)
    )
    solve_began = time.perf_counter()
    relaxed = relax_stages(model, stages, solver)
    lp = solver.records[0]  # the first stage's LP (relax_stages keeps only those with a value)
    if lp.termination == str(Termination.INFEASIBLE) or (
        lp.termination == str(Termination.OPTIMAL) and lp.objective is not None and lp.objective <= floor
    ):
        return None, False
    # no fold (its cost MIP would take the goodput cutoff as its own) and no tie-break below the floor
    start = primal_start(model, relaxed, stages[0], solver, hint)
    primary = solve_primary(model, stages[0], start, solver)
    if primary.termination is Termination.INFEASIBLE:
        return None, True
    if primary.has_solution and (primary.objective is None or primary.objective <= floor):
        # the start, kept by HiGHS below its cutoff, or a backend without the cutoff (ortools), which
        # solves to the optimum: nothing above the floor, so its cost tie-break is never run
        return None, True
    final = tie_break(model, stages, primary, solver)
    return assign_outcome(model, relaxed, primary, final, solver, solve_began, stages[0][1]), True


def _solve(model: _Model, stages: list[tuple[str, Sense]], clock: _Clock, hint: np.ndarray | None) -> Outcome:
    """Steps 2-6 on a built model."""
    solver = _Solver(get_backend(clock.options.solver), clock, budgeted=budget_binds(model.cand.request))
    solve_began = time.perf_counter()
    relaxed = relax_stages(model, stages, solver)
    return _finish(model, stages, relaxed, solver, solve_began, hint)


def _finish(
    model: _Model,
    stages: list[tuple[str, Sense]],
    relaxed: list[SolveResult],
    solver: _Solver,
    solve_began: float,
    hint: np.ndarray | None,
) -> Outcome:
    """Steps 2b-6, after the relaxations."""
    folded = fold_stages(model, stages, relaxed, solver)
    if folded is not None:
        primary, final = folded
    else:
        start = primal_start(model, relaxed, stages[0], solver, hint)
        start = search_neighbourhoods(model, relaxed, stages[0], solver, start)
        primary = solve_primary(model, stages[0], start, solver)
        final = tie_break(model, stages, primary, solver)
    return assign_outcome(model, relaxed, primary, final, solver, solve_began, stages[0][1])


def build_model(cand: Candidates, clock: _Clock) -> _Model:
    """Step 1: the matrix form of the candidates, timed from optimize()'s entry."""
    form, cols = matrix_for(cand)
    return _Model(cand, form, cols, (time.perf_counter() - clock.began) * 1e3)


def relax_stages(model: _Model, stages: list[tuple[str, Sense]], solver: _Solver) -> list[SolveResult]:
    """Step 2: the LP relaxation through every stage, each optimum locked for the next; stops at the first
    failure. The min-cost LP always joins: it packs devices where the goodput LP spreads them. Every LP
    after the first gets at most LATER_RELAXATION_SHARE of the time limit, and none runs on a large
    instance (`is_large`): there the locked LPs are 2-4x slower than the first (on L the min-cost one ran
    out its share without a solution on 3 of 5 seeds) and the neighbourhood search needs the time more than
    the sub-MIP's box needs them (docs/solvers.md, "Neighbourhoods on large instances")."""
    box_stages = stages if any(n == "cost" for n, _ in stages) else [*stages, ("cost", Sense.MIN)]
    form = model.form
    results: list[SolveResult] = []
    for name, sense in box_stages:
        clock = solver.clock
        if results and is_large(results[0]):
            break
        result = solver.call(
            "relaxation",
            name,
            form,
            form.objectives[name],
            sense,
            time_limit_s=clock.share(LATER_RELAXATION_SHARE) if results else clock.remaining(),
            mip_rel_gap=0.0,
            relax=True,
        )
        if result.objective is None:
            break
        results.append(result)
        form = lock_stage(form, name, sense, result.objective)
    return results


def fold_stages(
    model: _Model, stages: list[tuple[str, Sense]], relaxed: list[SolveResult], solver: _Solver
) -> tuple[SolveResult, _Final] | None:
    """Step 2b: the exact one-solve case of the cost tie-break, or None (then steps 3-5 run).

    When the goodput LP serves every class fully (its value is U = sum_w v_w lambda_w, every v_w > 0;
    a class no candidate pool serves counts with lambda_w = 0, formulation.servable_demand: no plan
    serves any of it), a plan that serves every class is goodput-optimal, and among those the
    lexicographic optimum is the cheapest: the min_cost model (demand rows as equalities, phi fixed at
    1). Its feasibility is only known once an integer plan serves everything, so the fold runs only when
    the boxed sub-MIP (primal_start) finds one; otherwise (the integers cannot serve it all) the staged
    route runs. The cost MIP is then the one MIP of the request, recorded as the "primary" step of stage
    "cost"; docs/formulation.md ("The cost tie-break in one solve") has the proof and why no weighting
    goodput - eps * cost is exact on this model.
    """
    names = [name for name, _ in stages]
    if names[-1] != "cost" or "goodput" not in names or len(relaxed) < len(stages):
        return None
    classes = model.cand.classes
    weight, demand = classes["weight"].to_numpy(float), servable_demand(model.cand)
    full = float(weight @ demand)
    goodput_lp = relaxed[names.index("goodput")].objective
    if np.any(weight[demand > 0] <= 0) or goodput_lp is None or goodput_lp < full - _slack(full):
        return None
    folded = _Model(model.cand, _serve_all(model.form, model.cols, demand), model.cols, model.build_ms)
    start = primal_start(folded, relaxed, ("cost", Sense.MIN), solver)
    if start is None:
        return None
    result = solve_primary(folded, ("cost", Sense.MIN), start, solver)
    if not result.has_solution:
        return None
    served = float(model.form.objectives["goodput"] @ result.values)
    termination = Termination.OPTIMAL if served >= full - _slack(full) else Termination.FEASIBLE
    # the primary stage (goodput, or phi for max_min_fraction) in its own units, bounded by its own LP
    value = float(model.form.objectives[names[0]] @ result.values)
    primary = SolveResult(termination, result.values, value, relaxed[0].objective, result.seconds, "folded")
    message = f"cost: {_reached(result)} (folded into one solve: every class servable)"
    return primary, _Final(folded.form, result, message, result.gap)


def _serve_all(form: MatrixForm, cols: Columns, demand: np.ndarray) -> MatrixForm:
    """The form with every demand row an equality (served[w] = lambda_w) and phi, if any, fixed at 1."""
    _, begin, end = next(block for block in form.row_blocks if block[0] == "demand")
    row_lo = form.row_lo.copy()
    row_lo[begin:end] = demand
    col_lo = form.col_lo.copy()
    if cols.has_phi:
        col_lo[cols.phi] = 1.0
    return replace(form, row_lo=row_lo, col_lo=col_lo)


def _slack(value: float) -> float:
    return LOCK_SLACK * max(1.0, abs(value))


def _reached(result: SolveResult) -> str:
    gap = "" if result.gap is None else f", gap {result.gap:.2%}"
    return f"{result.termination}{gap} in {result.seconds:.2f} s"


def primal_start(
    model: _Model,
    relaxed: list[SolveResult],
    stage: tuple[str, Sense],
    solver: _Solver,
    hint: np.ndarray | None = None,
) -> np.ndarray | None:
    """Step 3: a start vector for the first stage's MIP: the sub-MIP's plan where it ends in its box, else
    the best of its incumbent, the greedy baseline's plan (_greedy_start, while time is left) and, without
    an incumbent, the rounded economical LP (None without LP solutions or integers). A `hint` (a
    neighbouring plan's vector on these columns, such as a higher budget's plan in a what-if sweep) joins
    the LP solutions in spanning the sub-MIP's box, with each of its pools one instance down too
    (hint_rows): the box then holds every plan that drops at most one instance per pool from it."""
    form, cols = model.form, model.cols
    if not relaxed or not form.integer.any():
        return None
    if model.cand.churn is not None:  # a re-plan: the plan in force, when it is still feasible
        start = _previous_start(model, stage, solver)
        if start is not None:
            return start
    x_lps = np.array([r.values[: cols.n_pools] for r in relaxed if r.values is not None])
    if hint is not None and len(hint) == form.A.shape[1]:
        x_lps = np.vstack([x_lps, hint_rows(hint[: cols.n_pools])])
    clock = solver.clock
    sub_limit = clock.share(SUB_MIP_SHARE)
    boxed = _sub_mip(form, cols, x_lps, stage, solver, sub_limit, clock.options.mip_rel_gap)
    if boxed.termination is Termination.OPTIMAL:
        return boxed.values
    # stopped short, its incumbent (if any) can be anything: the best of it, the greedy baseline's plan
    # (which a cutoff would refuse) and, without an incumbent, the economical LP rounded
    starts = [boxed.values]
    if (
        stage == GREEDY_STAGE
        and solver.cutoff is None
        and clock.remaining() >= GREEDY_SHARE * clock.options.time_limit_s
    ):
        starts.append(_greedy_start(model, stage, solver))
    if boxed.values is None:
        starts.append(_rounded_flows(model, x_lps[-1], stage, solver, clock.remaining()))
    return _best(starts, form.objectives[stage[0]], stage[1])


def _greedy_start(model: _Model, stage: tuple[str, Sense], solver: _Solver) -> np.ndarray | None:
    """The greedy baseline's instances (baselines.greedy_run), their flows re-solved for `stage`: a start
    that keeps the plan at least as good as the baseline it is compared with where the sub-MIP stopped
    before its box's optimum (time-starved, its incumbent can be anything: docs/formulation.md, "The greedy
    start")."""
    instances = greedy_run(model.cand)[1].instances
    if instances is None or not instances.any():
        return None
    x = np.clip(instances, model.form.col_lo[: model.cols.n_pools], model.form.col_hi[: model.cols.n_pools])
    return _flows_at(model, x, stage, solver, solver.clock.remaining())


def _best(starts: list[np.ndarray | None], objective: np.ndarray, sense: Sense) -> np.ndarray | None:
    """The best of the start vectors found (None where there is none) by `objective`."""
    found = [x for x in starts if x is not None]
    if not found:
        return None
    values = [float(objective @ x) for x in found]
    return found[int(np.argmax(values) if sense is Sense.MAX else np.argmin(values))]


def is_large(first_lp: SolveResult) -> bool:
    """Whether the first LP relaxation took LNS_LP_S or more: the full MIP's root (dozens of such LPs, and
    cut rounds) will not end in a time limit of seconds. The instance's size decides, not the limit."""
    return first_lp.seconds >= LNS_LP_S


def search_neighbourhoods(
    model: _Model,
    relaxed: list[SolveResult],
    stage: tuple[str, Sense],
    solver: _Solver,
    start: np.ndarray | None,
) -> np.ndarray | None:
    """Step 3b: `start` improved by neighbourhood.improve until `search_share` of the time limit on a large
    instance (is_large: the full MIP's root would not end in time); `start` itself elsewhere. Each sub-MIP
    is recorded as step "neighbourhood"."""
    clock, options = solver.clock, solver.clock.options
    if start is None or not relaxed or relaxed[0].values is None or not is_large(relaxed[0]):
        return start
    name, sense = stage
    until = min(
        clock.began + search_share(relaxed[0], options.time_limit_s) * options.time_limit_s, clock.deadline
    )

    def solve(form: MatrixForm, limit: float, begin: np.ndarray) -> SolveResult:
        return solver.call(
            "neighbourhood",
            name,
            form,
            form.objectives[name],
            sense,
            time_limit_s=limit,
            mip_rel_gap=options.mip_rel_gap,
            start=begin,
        )

    x_lp = relaxed[0].values[: model.cols.n_pools]
    return improve(
        model.cand,
        model.form,
        model.cols,
        start,
        x_lp,
        stage,
        solve,
        lambda: until - time.perf_counter(),
        LNS_CALL_SHARE * options.time_limit_s,
    )


def search_share(first_lp: SolveResult, time_limit_s: float) -> float:
    """The share of the time limit the neighbourhood search runs for: LNS_UNTIL where the full MIP's share
    after it holds ROOT_LPS first LP relaxations, LNS_LAST where it does not."""
    return LNS_UNTIL if (1 - LNS_UNTIL) * time_limit_s >= ROOT_LPS * first_lp.seconds else LNS_LAST


def hint_rows(x: np.ndarray) -> np.ndarray:
    """A neighbouring plan's instances and the same less one instance per pool (at least 0): the rows the
    sub-MIP's box spans for a hint (today the marginal values': optimize_above with the point's plan).
    Measured in session 10 on paper.json's 100-point budget sweep, each point hinted with the plan above it:
    the starts came within 0-3% of each optimum (2-8% without), and the solves took 5-10% less CPU; since
    session 22 the points are solved without it (docs/whatif.md, "Each point is a single plan")."""
    x = np.round(x)
    return np.vstack([x, np.maximum(x - 1, 0)])


def solve_primary(
    model: _Model, stage: tuple[str, Sense], start: np.ndarray | None, solver: _Solver
) -> SolveResult:
    """Step 4: the full MIP of the first stage, seeded with the start."""
    name, sense = stage
    return solver.call(
        "primary",
        name,
        model.form,
        model.form.objectives[name],
        sense,
        time_limit_s=solver.clock.remaining(),
        mip_rel_gap=solver.clock.options.mip_rel_gap,
        start=start,
    )


def tie_break(
    model: _Model, stages: list[tuple[str, Sense]], primary: SolveResult, solver: _Solver
) -> _Final:
    """Step 5: each further stage with the previous one locked, warm-started from its plan, at most
    TIE_BREAK_SHARE of the time limit each. A stage that finds nothing keeps the previous stage's plan."""
    form, (name, sense), result = model.form, stages[0], primary
    clock, message = solver.clock, None
    for next_name, next_sense in stages[1:]:
        if not result.has_solution or result.objective is None:
            break
        if clock.passed():
            message = f"skipped {next_name}: time limit reached"
            break
        form_locked = lock_stage(form, name, sense, result.objective)
        follow = solver.call(
            "tie_break",
            next_name,
            form_locked,
            form.objectives[next_name],
            next_sense,
            time_limit_s=clock.share(TIE_BREAK_SHARE),
            mip_rel_gap=clock.options.mip_rel_gap,
            start=result.values,
        )
        if not follow.has_solution:
            message = f"{next_name}: {follow.termination} ({follow.detail}); kept the previous stage's plan"
            break
        message = f"{next_name}: {_reached(follow)}"
        form, name, sense, result = form_locked, next_name, next_sense, follow
    return _Final(form, result, message, result.gap if result is not primary else None)


def assign_outcome(
    model: _Model,
    relaxed: list[SolveResult],
    primary: SolveResult,
    final: _Final,
    solver: _Solver,
    solve_began: float,
    sense: Sense = Sense.MAX,
) -> Outcome:
    """Step 6: the Outcome: the last stage's vector, the primary stage's value and bound (the tighter of
    the MIP's and the first LP relaxation's), the LP bound and the record of every solver call."""
    return Outcome(
        candidates=model.cand,
        columns=model.cols,
        form=final.form,
        values=final.result.values,
        termination=_overall(primary, final.result),
        primary_value=primary.objective,
        primary_bound=_tightest_bound(primary, relaxed, sense),
        lp_bound=relaxed[0].objective if relaxed else None,
        build_ms=model.build_ms,
        solve_ms=(time.perf_counter() - solve_began) * 1e3,
        tie_break=final.tie_break,
        tie_break_gap=final.tie_break_gap,
        stages=tuple(solver.records),
    )


def _tightest_bound(primary: SolveResult, relaxed: list[SolveResult], sense: Sense) -> float | None:
    """The primary stage's proven bound: the MIP's dual bound, or the first LP relaxation's optimum (a bound
    on the same objective over the same model) where that is tighter, e.g. when the time limit stops the
    MIP before its root LP is solved and HiGHS reports only its trivial bound."""
    bound = primary.bound
    if not relaxed or relaxed[0].termination is not Termination.OPTIMAL or primary.detail == "folded":
        return bound
    lp = relaxed[0].objective
    if bound is None or lp is None:
        return bound if bound is not None else lp
    return min(bound, lp) if sense is Sense.MAX else max(bound, lp)


def _overall(primary: SolveResult, last: SolveResult) -> Termination:
    """Optimal only if the primary stage was proven optimal and the plan kept is a solution."""
    if not last.has_solution:
        return primary.termination
    if primary.termination is Termination.OPTIMAL:
        return Termination.OPTIMAL
    return Termination.FEASIBLE if primary.has_solution else primary.termination


def lock_stage(form: MatrixForm, name: str, sense: Sense, value: float) -> MatrixForm:
    """Keep a finished stage's objective at the value found (up to a relative LOCK_SLACK for round-off)."""
    slack = _slack(value)
    if sense is Sense.MAX:
        return form.with_row(f"lock_{name}", form.objectives[name], value - slack, np.inf)
    return form.with_row(f"lock_{name}", form.objectives[name], -np.inf, value + slack)


def _sub_mip(
    form: MatrixForm,
    cols: Columns,
    x_lps: np.ndarray,
    stage: tuple[str, Sense],
    solver: _Solver,
    time_limit_s: float,
    mip_rel_gap: float,
) -> SolveResult:
    """The MIP with every x boxed in [floor(min over LP solutions), ceil(max over LP solutions)]."""
    name, sense = stage
    n = cols.n_pools
    boxed = replace(form, col_lo=form.col_lo.copy(), col_hi=form.col_hi.copy())
    boxed.col_lo[:n] = np.floor(x_lps.min(axis=0) + INTEGRALITY_TOL)
    boxed.col_hi[:n] = np.minimum(np.ceil(x_lps.max(axis=0) - INTEGRALITY_TOL), form.col_hi[:n])
    boxed.col_lo[:n] = np.minimum(boxed.col_lo[:n], boxed.col_hi[:n])
    return solver.call(
        "start", name, boxed, form.objectives[name], sense, time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap
    )


def _rounded_flows(
    model: _Model, relaxed_values: np.ndarray, stage: tuple[str, Sense], solver: _Solver, time_limit_s: float
) -> np.ndarray | None:
    """Round the relaxation's x and re-solve the flows with x fixed: a full feasible start vector."""
    x = rounded_start(model.form, model.cols, model.cand, relaxed_values[: model.cols.n_pools])
    return _flows_at(model, x, stage, solver, time_limit_s)


def _previous_start(model: _Model, stage: tuple[str, Sense], solver: _Solver) -> np.ndarray | None:
    """The plan in force as a start: its instances fixed (within the bounds), the flows re-solved."""
    form, n = model.form, model.cols.n_pools
    x = np.clip(previous_instances(model.cand), form.col_lo[:n], form.col_hi[:n])
    return _flows_at(model, x, stage, solver, solver.clock.share(SUB_MIP_SHARE))


def _flows_at(
    model: _Model, x: np.ndarray, stage: tuple[str, Sense], solver: _Solver, time_limit_s: float
) -> np.ndarray | None:
    """A full start vector: the instances fixed at `x`, the flows re-solved (an LP) for `stage`."""
    form, cols = model.form, model.cols
    name, sense = stage
    # the owner switches too: the LP would leave a z[o] at served / demand, not an integer
    switches = cols.switch_offset + np.arange(cols.n_switches)
    fixed = np.concatenate([np.arange(cols.n_pools), switches])
    result = solver.call(
        "start",
        name,
        form.with_fixed(fixed, np.concatenate([x, switch_values(model.cand, cols, x)])),
        form.objectives[name],
        sense,
        time_limit_s=time_limit_s,
        mip_rel_gap=0.0,
        relax=True,
    )
    return result.values


def rounded_start(form: MatrixForm, cols: Columns, cand: Candidates, x_lp: np.ndarray) -> np.ndarray:
    """Integer instances near the LP optimum that respect device counts and the budget.

    Floor every x, then add one instance to pools in order of falling fractional part while the device
    (and budget) rows allow: what an engineer would do by hand with the LP's answer.
    """
    x = np.floor(x_lp + INTEGRALITY_TOL)
    x = np.minimum(x, form.col_hi[: cols.n_pools])
    devices = cand.devices.set_index("device")
    tp = cand.pools["tp"].to_numpy(float)
    device_of = cand.pools["device"].to_numpy()
    free = (devices["count"] - (cand.pools.assign(u=x * tp).groupby("device")["u"].sum())).fillna(
        devices["count"]
    )
    budget = budget_row(cand.request)
    price = cand.pools["device"].map(devices["cost_per_hour"]).to_numpy(float) * tp
    spend = float(price @ x)
    for index in np.argsort(-(x_lp - x), kind="stable"):
        fraction = x_lp[index] - x[index]
        if fraction <= MIN_ROUND_UP:
            break
        fits = free[device_of[index]] >= tp[index] and x[index] + 1 <= form.col_hi[index]
        affordable = spend + price[index] <= budget + BUDGET_TOL
        if fits and affordable:
            x[index] += 1
            free[device_of[index]] -= tp[index]
            spend += price[index]
    return x
