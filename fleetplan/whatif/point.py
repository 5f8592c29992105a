"""One grid point: its request, its plan (solved as solver.plan solves it, or provably another budget's
plan), its summary.

A PointSolver runs the points one executor task owns, in falling budget order, and keeps every plan it
solved. A point it solves takes the very solver calls of a single `POST /plan` (optimize.optimize, no
start from a neighbour): the MILP often has several plans of one value, the passes after it (the pooled
credit, the window guard) credit them differently, and a start from a neighbouring point led HiGHS to
another of them (docs/whatif.md, "Each point is a single plan"). An exact shortcut makes a budget sweep
cheap without changing the MILP's value:

- a plan solved under budget B that costs C is also the plan under every budget in [C, B]: it is feasible
  there, and no plan there can beat it, since every such plan was feasible under B too (reuse). When B is
  at least the fleet's cost (every device at its capacity, formulation.spends_all) the budget cuts
  nothing off and every such budget is one model (its budget rows at that cost: formulation.budget_row),
  so the plan answers every budget from C up (service.task_chunks gives those points one task). The same
  holds for each device type's capacity, between what the plan's MILP uses of it and what it was solved
  with (Reach). The MILP's value is the point's; of several plans of that value, a single plan at the
  point's own budget may find another, which the passes after the MILP may credit differently.

A task runs its points in falling budget (and device count) order, so that each plan answers the task's
lower points down to its cost: on paper.json every plateau of the curve (two grid points with one
optimum) costs one solve.
"""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np

from fleetplan.models.codec import encode
from fleetplan.models.errors import SolverFailure
from fleetplan.models.plan import PlanRequest
from fleetplan.models.whatif import BaselinePoint, Point, PointBaselines, WhatIfRequest
from fleetplan.profiler.tables import ProfileTable
from fleetplan.solver import baselines, extract
from fleetplan.solver.backends import Termination, relative_gap
from fleetplan.solver.candidates import Candidates, build_candidates, check_profiles_cover, device_table
from fleetplan.solver.explain import has_room
from fleetplan.solver.formulation import pool_cost, servable_demand, spends_all, with_matrix_memo
from fleetplan.solver.optimize import Outcome, optimize_above
from fleetplan.solver.window import optimize_or_fall_back, settle
from fleetplan.whatif.grid import one_more, shares_candidates, variant, widened

_STATUS = {
    Termination.OPTIMAL: "optimal",
    Termination.FEASIBLE: "feasible",
    Termination.INFEASIBLE: "infeasible",
}
# a limit is binding when what is left of it is below this share of it (rows in RPS or Gbit/s)
BINDING_TOL = 1e-6
# a class is served in full when its served RPS is within this share of its demand
SERVED_TOL = 1e-6


@dataclass(frozen=True)
class SweepContext:
    """What every task of one sweep shares: the request, the grid, the profiles and (for axes that keep
    the candidates) the one candidate set built from the widened base request."""

    request: WhatIfRequest
    coords: list[dict[str, float]]
    table: ProfileTable
    shared: Candidates | None
    # the profile's tensor-parallel sizes per device type: which of a point's pools fit (fit_signature)
    tps: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Solved:
    """One solved request, summarized."""

    status: str
    slo_rps: float
    demand_rps: float
    cost: float
    mip_gap: float | None
    used: dict[str, int]
    binding: list[str]  # the links and demand (device_binding and budget_binding are the point's own)
    values: np.ndarray | None
    ms: float
    reused: bool = False
    objective: float | None = None  # the MILP's first-stage value (before the pooled credit)
    # the budget row at the MILP's own instances: what reuse compares with a budget. `cost` is lower where
    # the pooled credit leaves an instance without load (the plan drops it); under a budget between the two
    # the MILP does not find that plan, and a single plan() would differ from the reused point
    spend: float = 0.0
    # devices per type of the MILP's own instances: what reuse compares with a point's device capacities
    # (`used` may be lower after the pooled credit, as `cost` is)
    milp_used: dict[str, int] = field(default_factory=dict)
    # the MILP served every class in full (all the demand a candidate pool serves: servable_rps), and
    # where the plan does not, serving it in full on the window guard's headroom needed more than the
    # point has (window.in_full_guarded), so one more device may make it
    milp_in_full: bool = False
    servable_rps: float | None = None  # formulation.servable_demand, summed (None: demand_rps)


@dataclass(frozen=True)
class Reach:
    """The resources a plan was solved under, as far as they reach: the highest budget it answers
    (reach_of: inf from the fleet's cost up) and each device type's capacity (count, or max_count)."""

    budget: float
    capacity: dict[str, int]

    def answers(self, solved: Solved, budget: float, capacity: dict[str, int]) -> bool:
        """Whether `solved`, solved under these resources, is the plan under `budget` and `capacity`, each
        at most these: it fits them (its MILP's spend and devices per type), so it is feasible there, and
        every plan feasible there was feasible where it was solved (docs/whatif.md, "Each point is a
        single plan")."""
        return answers(solved.spend, budget, self.budget) and all(
            solved.milp_used.get(name, 0) <= n <= self.capacity.get(name, -1) for name, n in capacity.items()
        )


def make_context(request: WhatIfRequest, coords: list[dict[str, float]], table: ProfileTable) -> SweepContext:
    """The context; candidates are built here once when no axis changes them."""
    shared = None
    frame = table.frame
    tps = {name: tuple(sorted({int(t) for t in group})) for name, group in frame.groupby("device")["tp"]}
    if shares_candidates(request.axes):
        base = widened(request.base, request.axes, request.marginal)
        check_profiles_cover(base, table)
        shared = with_matrix_memo(build_candidates(base, table))  # one model per request but for the budget
    return SweepContext(request, coords, table, shared, tps)


def fit_signature(request: PlanRequest, tps: dict[str, tuple[int, ...]]) -> tuple:
    """Per device type, the profiled tensor-parallel sizes one instance of which fits its capacity: the
    only way device counts reach the candidate tables (candidates.fleet_points). Two requests equal but
    for their counts, with one signature, have the same tables; with different ones they may not (a
    device type with no instance that fits takes its decode tier out, and with it the KV transfers the
    prefill uses are sized for)."""
    return tuple((d.name, tuple(t for t in tps.get(d.name, ()) if t <= d.capacity)) for d in request.devices)


@dataclass
class PointSolver:
    """Solves the points of one task; keeps its plans for reuse."""

    ctx: SweepContext
    # per request but for its budget and device capacities (resource_key): (reach, plan) for reuse
    plans: dict[bytes, list[tuple[Reach, Solved]]] = field(default_factory=dict)
    # per request but for its budget: (reach, baseline name, its result) for reuse along the budget
    kept_baselines: dict[bytes, list[tuple[float, str, BaselinePoint]]] = field(default_factory=dict)
    # candidate tables built for requests the shared ones do not fit: (request key, fit_signature) -> tables
    tables: dict[tuple[bytes, tuple], Candidates] = field(default_factory=dict)
    solves: int = 0
    reused: int = 0
    built: int = 0
    screened: int = 0  # marginal values settled by optimize_above's LP relaxation, without a MIP

    def point(self, index: int) -> Point:
        coords = self.ctx.coords[index]
        request = variant(self.ctx.request.base, coords)
        cand = self.candidates_for(request)
        solved = self.solve(request, cand)
        marginal = self.marginal(request, cand, solved) if self.ctx.request.marginal else {}
        return Point(
            coords=coords,
            status=solved.status,  # type: ignore[arg-type]
            slo_rps=solved.slo_rps,
            demand_rps=solved.demand_rps,
            cost_per_hour=solved.cost,
            mip_gap=solved.mip_gap,
            devices=solved.used,
            bought={d.name: max(solved.used.get(d.name, 0) - d.count, 0) for d in request.devices},
            binding=device_binding(request, self.ctx.shared or cand, solved.used)
            + solved.binding
            + budget_binding(request, cand, solved.cost, solved.used),
            marginal_rps=marginal,
            baselines=self.baselines(request, cand) if self.ctx.request.baselines else None,
            solve_ms=round(solved.ms, 3),
            reused=solved.reused,
        )

    def baselines(self, request: PlanRequest, cand: Candidates) -> PointBaselines:
        """Both baselines of solver.plan at this point. Each is reused along the budget like a plan (reuse):
        one computed under a budget B that spends C is the same under every budget in [C, B], and from the
        fleet's cost up under every budget (docs/whatif.md, "Baselines along the budget")."""
        key, budget = budget_key(request)
        kept = self.kept_baselines.setdefault(key, [])
        found: dict[str, BaselinePoint] = {}
        for name, run in BASELINES.items():
            fits = (p for reach, n, p in kept if n == name and answers(p.cost_per_hour, budget, reach))
            hit = next(fits, None)
            if hit is None:
                hit = run(cand)
                kept.append((reach_of(request, budget), name, hit))
            found[name] = hit
        return PointBaselines(**found)

    def candidates_for(self, request: PlanRequest) -> Candidates:
        """The candidate tables of `request` with its devices and options: the sweep's shared tables where
        the same pools fit (fit_signature), else tables built for it, kept per request but for its
        budget and counts and per signature (a point's marginal values take their own, through here)."""
        shared, signature = self.ctx.shared, fit_signature(request, self.ctx.tps)
        if shared is not None and signature == fit_signature(shared.request, self.ctx.tps):
            cand = shared
        else:
            key = (resource_key(request)[0] if shared is None else b"", signature)
            cand = self.tables.get(key)
            if cand is None:
                check_profiles_cover(request, self.ctx.table)
                cand = with_matrix_memo(build_candidates(request, self.ctx.table))
                self.tables[key] = cand
                self.built += 1
        return dataclasses.replace(cand, request=request, devices=device_table(request))

    def plan_key(self, request: PlanRequest) -> tuple[bytes, float, dict[str, int]]:
        """resource_key with the request's fit_signature in the key: a plan answers only requests on the
        same candidate tables."""
        key, budget, capacity = resource_key(request)
        return key + repr(fit_signature(request, self.ctx.tps)).encode(), budget, capacity

    def solve(self, request: PlanRequest, cand: Candidates) -> Solved:
        """The plan of `request`: another budget's plan where provably the same, else its own solve."""
        kept = self.reuse(request)
        if kept is not None:
            return kept
        began = time.perf_counter()
        solved = solve_request(request, cand)
        return self.keep(request, dataclasses.replace(solved, ms=(time.perf_counter() - began) * 1e3))

    def reuse(self, request: PlanRequest) -> Solved | None:
        """A kept plan that is provably this request's: solved on the same request but for the budget and
        the device capacities, under resources at least this request's, and fitting this request's (its
        MILP's spend within this budget, its devices per type within these capacities): Reach.answers."""
        key, budget, capacity = self.plan_key(request)
        for reach, solved in self.plans.get(key, []):
            if reach.answers(solved, budget, capacity):
                self.reused += 1
                return dataclasses.replace(solved, reused=True, ms=0.0)
        return None

    def keep(self, request: PlanRequest, solved: Solved) -> Solved:
        """Count a solve and remember its plan."""
        self.solves += 1
        return self.remember(request, solved)

    def remember(self, request: PlanRequest, solved: Solved) -> Solved:
        """Keep `solved` as the plan of `request` for reuse (up to its budget, or from its cost up when
        the budget cuts nothing off) and as a start."""
        key, budget, capacity = self.plan_key(request)
        self.plans.setdefault(key, []).append((Reach(reach_of(request, budget), capacity), solved))
        return solved

    def marginal(self, request: PlanRequest, cand: Candidates, solved: Solved) -> dict[str, float]:
        """SLO RPS one more device of each type adds (same budget): 0 without a pool on the type or when
        all demand is served, else the difference of two plans (0 when within the MIP gap: solver noise)."""
        out: dict[str, float] = {}
        served_all = solved.slo_rps >= solved.demand_rps * (1 - SERVED_TOL)
        for device in request.devices:
            more = one_more(request, device.name)
            more_cand = None if served_all else self.candidates_for(more)
            if more_cand is None or device.name not in set(more_cand.pools["device"]):
                out[device.name] = 0.0
                continue
            same = more_cand.pools is cand.pools  # one more device fits no new pool: the same tables
            extra = self.one_more_device(more, more_cand, solved, (device.name, device.capacity), same)
            gain = extra.slo_rps - solved.slo_rps
            noise = max(request.options.mip_rel_gap * max(extra.slo_rps, 1.0), 1e-6)
            out[device.name] = round(gain, 9) if gain > noise else 0.0
        return out

    def one_more_device(
        self, more: PlanRequest, cand: Candidates, solved: Solved, device: tuple[str, int], same: bool = True
    ) -> Solved:
        """The plan of `more` (the point's request with one more device of type device[0], which it has
        device[1] of).

        A kept plan that provably answers it comes first (solve's reuse). Otherwise, every plan of `more`
        either leaves that extra device unused, and so is a plan of the point, or uses it. So `more`'s
        optimum is the best plan that uses it where that beats the point's MILP value by more than the MIP
        gap, and the point's own plan otherwise: optimize.optimize_above solves exactly that (its LP
        relaxation settles most devices without a MIP, and its MIP prunes every node that cannot beat
        the point); the point's plan is then kept as `more`'s up to this budget. Objectives other than
        max_goodput, a search stopped without a plan, and a `more` on other candidate tables than the
        point's (`same` false: one more device fits a pool the point's count did not, fit_signature, so
        the plans that leave it unused are not the point's plans) solve `more` itself."""
        kept = self.reuse(more)
        if kept is not None:
            return kept
        servable = solved.demand_rps if solved.servable_rps is None else solved.servable_rps
        short = solved.milp_in_full and solved.slo_rps < servable * (1 - SERVED_TOL)
        if more.options.objective != "max_goodput" or solved.objective is None or not same or short:
            return self.solve(more, cand)
        floor = solved.objective + more.options.mip_rel_gap * max(abs(solved.objective), 1.0)
        began = time.perf_counter()
        outcome, mip = optimize_above(more, cand, floor, device, hint=solved.values)
        ms = (time.perf_counter() - began) * 1e3
        if outcome is None:
            self.solves += mip
            self.screened += not mip
            return self.remember(more, solved)
        status = _STATUS.get(outcome.termination)
        if outcome.values is None or status is None:
            self.solves += 1
            return self.solve(more, cand)
        return self.keep(more, dataclasses.replace(summarize(more, cand, outcome, status), ms=ms))


def reach_of(request: PlanRequest, budget: float) -> float:
    """The highest budget a plan or baseline computed under `budget` answers: that budget, or every budget
    when it is at least the fleet's cost (the budget row then cuts nothing off)."""
    return np.inf if spends_all(request, budget) else budget


def answers(spend: float, budget: float, reach: float) -> bool:
    """Whether a result that spends `spend` and reaches up to `reach` (reach_of) is the one at `budget`:
    it fits that budget, and every plan that fits was a candidate where it was computed."""
    return spend <= budget + 1e-9 and budget <= reach


def budget_key(request: PlanRequest) -> tuple[bytes, float]:
    """The request without its budget (plans are reusable only between requests equal but for it), and
    the budget (inf when there is none)."""
    options = request.options
    budget = np.inf if options.budget_per_hour is None else float(options.budget_per_hour)
    rest = msgspec.structs.replace(request, options=msgspec.structs.replace(options, budget_per_hour=None))
    return encode(rest), budget


def resource_key(request: PlanRequest) -> tuple[bytes, float, dict[str, int]]:
    """The request without its budget and its devices' counts and max_counts (plans are reusable only
    between requests equal but for these), the budget (inf when there is none) and each device type's
    capacity (what the device rows allow: max_count, else count; a plan's cost and bought devices follow
    from its instances, so owning or buying a device makes no difference to the model)."""
    devices = [msgspec.structs.replace(d, count=0, max_count=None) for d in request.devices]
    key, budget = budget_key(msgspec.structs.replace(request, devices=devices))
    return key, budget, {d.name: d.capacity for d in request.devices}


def solve_request(request: PlanRequest, cand: Candidates) -> Solved:
    """Solve as solver.plan does (the same optimize calls, the min_cost fallback, the same numbers), but
    return only the summary a point needs."""
    demand = float(cand.classes["rate_rps"].sum())
    if cand.uses.empty:
        return Solved("no_candidates", 0.0, demand, 0.0, 0.0, _zeros(request), [], None, 0.0)
    outcome, fell_back = optimize_or_fall_back(request, cand)
    status = "infeasible" if fell_back else _STATUS.get(outcome.termination)
    if outcome.values is None or status is None:
        msg = (
            f"solver {request.options.solver} found no plan ({outcome.termination}) within "
            f"time_limit_s={request.options.time_limit_s} at a what-if point; raise the time limit"
        )
        raise SolverFailure(msg, field="base.options.time_limit_s")
    return summarize(request, cand, outcome, status)


def summarize(request: PlanRequest, cand: Candidates, outcome: Outcome, status: str) -> Solved:
    """A solved request's summary: the pooled credit and the window guard applied as solver.plan applies
    them, then the point's numbers; the MILP's own vector and value are kept for the marginal values."""
    # the MILP's own vector is the marginal values' hint and floor (the credited one breaks capacity rows)
    milp_values = outcome.values
    objective = outcome.primary_value
    # as plan(): the tables and request the outcome solved (a min_cost plan's capped ones, a min_cost
    # fallback's max_goodput request), settled as that request
    cand = outcome.candidates
    instances = np.round(milp_values[: outcome.columns.n_pools])
    spend = float(pool_cost(cand) @ instances)
    milp_used = extract.devices_used(cand, instances)
    demand = float(cand.classes["rate_rps"].sum())
    servable = float(servable_demand(cand).sum())
    milp_flow = milp_values[outcome.columns.use_offset : outcome.columns.use_offset + len(cand.uses)]
    milp_served = float(extract.served_by_class(cand, np.maximum(milp_flow, 0.0)).sum())
    cand, outcome = settle(cand.request, cand, outcome, fell_back=status == "infeasible")
    # a plan served in full on the guard's headroom (window.in_full_guarded) takes other instances than
    # the MILP's: a lower budget or count answers with it only where it fits there too
    settled = np.round(outcome.values[: outcome.columns.n_pools])
    spend = max(spend, float(pool_cost(cand) @ settled))
    after = extract.devices_used(cand, settled)
    milp_used = {name: max(n, after[name]) for name, n in milp_used.items()}
    sol = extract.solution_from(cand, outcome.columns, outcome.values)
    devices = extract.devices_out(cand, sol)
    price = {d.name: d.cost_per_hour for d in request.devices}
    cost = float(sum(price[d.name] * d.used for d in devices))
    served = float(sol.flow[(cand.uses["role"] != "decode").to_numpy()].sum())
    value, bound = outcome.primary_value, outcome.primary_bound
    gap = None if value is None or bound is None else relative_gap(value, bound)
    return Solved(
        status=status,
        slo_rps=round(served, 9),
        demand_rps=demand,
        cost=round(cost, 9),
        mip_gap=gap,
        used={d.name: d.used for d in devices},
        binding=binding_constraints(request, cand, sol, served),
        values=milp_values,
        ms=0.0,
        objective=objective,
        spend=round(spend, 9),
        milp_used=milp_used,
        milp_in_full=milp_served >= servable * (1 - SERVED_TOL),
        servable_rps=servable,
    )


def _zeros(request: PlanRequest) -> dict[str, int]:
    return {d.name: 0 for d in request.devices}


def device_binding(request: PlanRequest, cand: Candidates, used: dict[str, int]) -> list[str]:
    """ "devices:NAME" for each type without room for one more instance of its smallest pool in `cand`
    (integer-aware; per point, as a reused plan keeps its devices but not the point's capacities; the
    sweep passes its shared tables where it has them, so a type with no instance that fits its count
    is binding too)."""
    pools = cand.pools
    out = []
    for device in request.devices:
        tp = pools["tp"].to_numpy()[(pools["device"] == device.name).to_numpy()]
        if len(tp) and device.capacity - used.get(device.name, 0) < tp.min():
            out.append(f"devices:{device.name}")
    return out


def binding_constraints(
    request: PlanRequest, cand: Candidates, sol: extract.Solution, served: float
) -> list[str]:
    """The plan's own limits without slack: a KV link (or the fleet-wide KV budget) at its planned headroom,
    and all demand served (the devices: device_binding; the budget: budget_binding)."""
    binding = _link_binding(request, cand, sol)
    demand = float(cand.classes["rate_rps"].sum())
    if demand > 0 and served >= demand * (1 - SERVED_TOL):
        binding.append("demand")
    return binding


def budget_binding(
    request: PlanRequest, cand: Candidates, cost: float, used: dict[str, int] | None = None
) -> list[str]:
    """["budget"] when what is left of budget_per_hour buys no instance of any pool whose device type has
    room for it (`used`: devices in use per type; a full type's cheap pools buy nothing, and counting them
    hid the budget at 5 and 19 $/h of paper.json's sweep), or, every type being full, no instance at all;
    a reused plan keeps its limits but not its budget, so this is checked per point."""
    budget = request.options.budget_per_hour
    price = pool_cost(cand)
    if budget is None or not (price > 0).any():
        return []
    fits = has_room(request, used or {}, cand.pools["device"], cand.pools["tp"].to_numpy())
    # the cheapest instance a type has room for; every type full: the cheapest of all (the budget then binds
    # beside the devices where it would not pay for one more either)
    open_prices = price[fits & (price > 0)]
    cheapest = open_prices.min() if len(open_prices) else price[price > 0].min()
    return ["budget"] if budget - cost < cheapest - 1e-9 else []


def _link_binding(request: PlanRequest, cand: Candidates, sol: extract.Solution) -> list[str]:
    uses = cand.uses
    prefill = (uses["role"] == "prefill").to_numpy()
    traffic = sol.flow * uses["kv_gbit"].to_numpy() * prefill
    source, target = uses["device"].to_numpy(), uses["key"].to_numpy()
    out = []
    for link in request.links:
        cap = cand.link_rho[(link.source, link.target)] * link.gbps
        sent = traffic[(source == link.source) & (target == link.target)].sum()
        if cap <= 0 or sent >= cap * (1 - BINDING_TOL):
            out.append(f"link:{link.source}->{link.target}")
    if request.kv_budget_gbps is not None:
        cap = cand.link_rho[None] * request.kv_budget_gbps
        if cap <= 0 or traffic[source != target].sum() >= cap * (1 - BINDING_TOL):
            out.append("kv_budget")
    return out


def gpu_only_point(cand: Candidates) -> BaselinePoint:
    """The GPU-only baseline of solver.plan at this point (the same function), with what it spends."""
    gpu, usage = baselines.gpu_only_run(cand, cand.request.options.time_limit_s)
    return BaselinePoint(slo_rps=gpu.slo_rps, cost_per_hour=round(usage.cost_per_hour, 9))


def greedy_point(cand: Candidates) -> BaselinePoint:
    """The greedy baseline of solver.plan at this point (the same function), with what it spends."""
    greedy, usage = baselines.greedy_run(cand)
    return BaselinePoint(slo_rps=greedy.slo_rps, cost_per_hour=round(usage.cost_per_hour, 9))


BASELINES: dict[str, Callable[[Candidates], BaselinePoint]] = {
    "gpu_only": gpu_only_point,
    "greedy": greedy_point,
}


RESOURCE_KINDS = ("budget_per_hour", "count", "max_count")


def resource_order(coords: dict[str, float]) -> tuple[float, ...]:
    """A sort key that puts a point after every point with more of each resource axis (budget, count,
    max_count; in axis order, largest first): the plans that may answer it come first."""
    return tuple(-v for k, v in coords.items() if k.partition(":")[0] in RESOURCE_KINDS)


def solve_chunk(
    ctx: SweepContext, indices: list[int], done: Callable[[int], None] | None = None
) -> tuple[list[tuple[int, Point]], dict[str, int]]:
    """One executor task: its points in falling order of their resources (budget, device counts; each
    plan answers the points below it down to what it uses: Reach.answers), and counts of candidate
    builds, solves, reuses and LP-settled marginal values; `done(1)` after each point when given."""
    solver = PointSolver(ctx)
    order = sorted(indices, key=lambda i: resource_order(ctx.coords[i]))
    out = []
    for i in order:
        out.append((i, solver.point(i)))
        if done is not None:
            done(1)
    return out, {
        "built": solver.built,
        "solves": solver.solves,
        "reused": solver.reused,
        "screened": solver.screened,
    }
