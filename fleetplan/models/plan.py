"""The request a planner takes and the plan it gives back (docs/request.md field by field, docs/api.md)."""

from typing import Annotated, Literal

from msgspec import Meta

from fleetplan.models.base import (
    Base,
    CostPerHour,
    Count,
    Fraction,
    Gbps,
    Name,
    NonNegFloat,
    PositiveInt,
    Rps,
    Total,
    duplicates,
)
from fleetplan.models.fleet import Device, Link, check_links
from fleetplan.models.profile import ProfilesSpec
from fleetplan.models.simulation import SimulationReport
from fleetplan.models.workload import CATALOG, ModelSpec, Workload

Objective = Literal["max_goodput", "min_cost", "max_min_fraction"]
Pooling = Literal["model", "class"]
CapacityModel = Literal["queueing", "flat"]
SolverName = Literal["highs", "pyomo", "ortools"]
Role = Literal["prefill", "decode", "colocated"]
Status = Literal["optimal", "feasible", "infeasible", "no_candidates"]
# the units of Plan.objective_value / objective_bound (docs/api.md)
ObjectiveUnit = Literal["rps", "weighted_rps", "min_fraction", "cost_per_hour", "devices"]


class Options(Base):
    """Every knob has a default, so `{}` is a valid Options."""

    objective: Objective = "max_goodput"
    # "queueing": each (class, pool), NIC and link gets the admissible load that keeps the class's SLO
    # percentile with the waits included (fleetplan/solver/capacity.py, docs/formulation.md); "flat": the
    # v1 model, every pool, NIC and link derated by max_utilization (0.5 when not given).
    capacity_model: CapacityModel = "queueing"
    # under "queueing" an optional cap on every admissible utilization; under "flat" the uniform headroom
    max_utilization: Fraction | None = None
    pooling: Pooling = "model"
    batch_sizes: Annotated[list[PositiveInt], Meta(min_length=1)] | None = None
    tp_degrees: Annotated[list[PositiveInt], Meta(min_length=1)] | None = None
    allow_colocated: bool = True
    allow_disaggregated: bool = True
    budget_per_hour: CostPerHour | None = None
    baseline_device: Name | None = None
    time_limit_s: Annotated[float, Meta(gt=0, le=600)] = 10.0
    mip_rel_gap: Annotated[float, Meta(ge=0, lt=1)] = 1e-4
    solver: SolverName = "highs"

    def __post_init__(self) -> None:
        if not 0 < self.time_limit_s <= 600:
            msg = f"time_limit_s: must be in (0, 600] seconds, got {self.time_limit_s}"
            raise ValueError(msg)
        if not 0 <= self.mip_rel_gap < 1:
            msg = f"mip_rel_gap: must be in [0, 1), got {self.mip_rel_gap}"
            raise ValueError(msg)
        if not (self.allow_colocated or self.allow_disaggregated):
            msg = "allow_disaggregated: false together with allow_colocated false; nothing could be served"
            raise ValueError(msg)
        for field in ("batch_sizes", "tp_degrees"):
            values = getattr(self, field)
            if values is not None and not values:
                msg = f"{field}: empty list; use null for 'all profiled'"
                raise ValueError(msg)


class PlanRequest(Base):
    """A fleet inventory, workload classes with SLOs, a profile set and options."""

    devices: Annotated[list[Device], Meta(min_length=1)]
    workloads: Annotated[list[Workload], Meta(min_length=1)]
    links: list[Link] = []
    kv_budget_gbps: Gbps | None = None
    models: list[ModelSpec] | None = None
    profiles: ProfilesSpec = ProfilesSpec(set="paper")
    options: Options = Options()
    # "simulate": replay the plan through the discrete-event simulator and attach the metrics
    verify: Literal["simulate"] | None = None

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("devices: empty; give at least one device type")
        if not self.workloads:
            raise ValueError("workloads: empty; give at least one workload class")
        for field, names in (
            ("devices", [d.name for d in self.devices]),
            ("workloads", [w.name for w in self.workloads]),
            ("models", [m.name for m in self.models or []]),
        ):
            repeated = duplicates(names)
            if repeated:
                msg = f"{field}: duplicate name(s) {repeated}"
                raise ValueError(msg)
        check_links(self.devices, self.links)
        known_models = self.model_specs()
        for index, workload in enumerate(self.workloads):
            if workload.model not in known_models:
                msg = (
                    f"workloads[{index}].model: unknown model {workload.model!r}; add it to 'models' "
                    f"(known: {sorted(known_models)})"
                )
                raise ValueError(msg)
        baseline = self.options.baseline_device
        if baseline is not None and baseline not in {d.name for d in self.devices}:
            msg = f"options.baseline_device: unknown device {baseline!r}"
            raise ValueError(msg)

    def model_specs(self) -> dict[str, ModelSpec]:
        """The catalog overlaid with the request's own models (a request's spec wins)."""
        return {**CATALOG, **{m.name: m for m in self.models or []}}


class PoolRef(Base):
    """One side of a route: the device type, tensor-parallel degree and batch of its pool."""

    device: Name
    tp: PositiveInt
    batch: PositiveInt
    group: Count = 0  # which group of pools with this (device, tp, batch): Pool.group


class Route(Base):
    """RPS of one class through one prefill->decode pool pair, or through one colocated pool.

    `ttft_ms` and `tbt_ms` are the capacity model's predictions at the class's SLO percentile with the
    waits included (queue, batch formation, decode slots, KV queues) at the plan's load; `prefill_ms`,
    `kv_transfer_ms` and `step_ms` are the service times alone (profile at the percentile, *full* batch).
    At light load batches are partial and faster, so `ttft_ms` may be below `prefill_ms`; it is at least
    `kv_transfer_ms` and at most the SLO. Under the flat model `ttft_ms = prefill_ms + kv_transfer_ms` and
    `tbt_ms = step_ms`. `kv_gbps` is the KV traffic.
    """

    prefill: PoolRef | None
    decode: PoolRef | None
    colocated: PoolRef | None
    rps: Rps
    ttft_ms: NonNegFloat
    tbt_ms: NonNegFloat
    kv_gbps: Total
    prefill_ms: NonNegFloat
    kv_transfer_ms: NonNegFloat
    step_ms: NonNegFloat = 0.0


class WorkloadResult(Base):
    """What a class gets; `reason` says in words why anything is unserved."""

    name: Name
    served_rps: Rps
    unserved_rps: Rps
    reason: str | None
    routes: list[Route]


class Pool(Base):
    """A group of identical instances; `workload` names the owning class under `pooling = "class"`."""

    model: Name
    role: Role
    device: Name
    tp: PositiveInt
    batch: PositiveInt
    instances: Count
    utilization: NonNegFloat
    workload: Name | None = None
    # the admissible utilization of this pool (capacity model); `utilization` never exceeds it
    headroom: Fraction = 1.0
    # 0, or 1, 2, ... for further groups of the same (model, role, device, tp, batch): run at a lower
    # headroom because they carry classes with tighter SLOs, or carrying only the shorter classes
    # (docs/formulation.md, "Headroom levels" and "Mixes")
    group: Count = 0


class DeviceUse(Base):
    """Devices of one type the plan uses of the `available` (owned) ones; `bought`: how many of the used
    ones are purchased beyond them (only for types with `max_count`)."""

    name: Name
    used: Count
    available: Count
    bought: Count = 0


class LinkUse(Base):
    """KV traffic between two device types; `budget_gbps` is null where no link budget was given."""

    source: Name
    target: Name
    gbps: Total
    budget_gbps: Gbps | None
    # the share of budget_gbps the plan may use (capacity model: max_utilization, or the M/D/1 cap)
    headroom: Fraction | None = None


class GpuOnlyBaseline(Base):
    device: Name | None
    slo_rps: Total
    reason: str | None = None


class GreedyBaseline(Base):
    slo_rps: Total


class Baselines(Base):
    gpu_only: GpuOnlyBaseline
    greedy: GreedyBaseline


StageStep = Literal["relaxation", "start", "neighbourhood", "primary", "tie_break", "pooled", "window"]
StageKind = Literal["lp", "submip", "mip"]


class StageRecord(Base):
    """One solver call the optimizer made (fleetplan/solver/optimize.py), in the order made.

    `step`: "relaxation" (the LP relaxation through every stage), "start" (the sub-MIP that seeds the MIP,
    or the LP with its rounded instances fixed), "primary" (the first stage's MIP), "tie_break" (a later
    stage, the earlier ones locked), "pooled" (the goodput LP with the instance counts fixed and the
    credit of pools of several instances, solver/pooled.py) or "window" (that LP again with the prefill
    and decode pools' headroom lowered where one judged window would break a class too often,
    solver/window.py; on a max_min_fraction plan a "phi" LP first, then the goodput one). `stage` is the
    objective solved ("goodput", "cost", "phi"). `kind`: "lp", "submip" (the MIP boxed around the LP
    solutions) or "mip" ("lp" for a stage without integers).
    `ms` is the call's wall time; `ended_ms` when it returned, in ms from the optimizer's entry (matrix
    build included). `objective` and `bound` are in the stage's own units, `gap` their relative_gap
    (docs/api.md, "mip_gap"); `nodes` the branch-and-bound nodes where the backend reports them (HiGHS).
    """

    step: StageStep
    stage: str
    kind: StageKind
    ms: NonNegFloat
    ended_ms: NonNegFloat
    termination: str
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    nodes: int | None = None


class SolverInfo(Base):
    """How the answer was found: sizes, times, bounds. `lp_bound` is the root LP relaxation's objective.

    `stages` lists every solver call of the solve reported (StageRecord), null when nothing was solved.
    `tie_break_gap` is the relative gap (docs/api.md, "mip_gap") of the last tie-break stage the plan kept
    (the cost stage of max_goodput), null when no tie-break stage ran or none found a plan.
    """

    backend: str
    build_ms: NonNegFloat
    solve_ms: NonNegFloat
    variables: Count = 0
    integers: Count = 0
    rows: Count = 0
    nonzeros: Count = 0
    lp_bound: float | None = None
    termination: str = ""
    tie_break: str | None = None
    stages: list[StageRecord] | None = None
    tie_break_gap: float | None = None


class ProfileSetInfo(Base):
    name: str
    sha256: str


class Plan(Base):
    """The answer: per-class routes, pools, device and link use, baselines and how it was solved.

    `slo_rps` is the SLO-compliant RPS (goodput). `bound_rps` is the solver's proven upper bound on it, given
    only where the objective is RPS itself (max_goodput with every weight 1); `objective_value` and
    `objective_bound` are the primary objective and its bound in `objective_unit` (weighted RPS when a
    weight differs from 1), and `mip_gap` is the relative distance between them.
    """

    status: Status
    objective: Objective
    slo_rps: Total
    demand_rps: Total
    bound_rps: float | None
    mip_gap: float | None
    cost_per_hour: Total
    workloads: list[WorkloadResult]
    pools: list[Pool]
    devices: list[DeviceUse]
    links: list[LinkUse]
    baselines: Baselines | None
    solver: SolverInfo
    profile_set: ProfileSetInfo
    warnings: list[str] = []
    simulation: SimulationReport | None = None
    # the share of kv_budget_gbps the plan may use (null without a fleet KV budget)
    kv_budget_headroom: Fraction | None = None
    # the primary objective solved, in its own units: sum_w weight_w * served_w ("rps" when every weight
    # is 1, else "weighted_rps"), min_w served_w / demand_w ("min_fraction"), or cost ("cost_per_hour";
    # "devices" when no device has a price); objective_bound is the solver's proven bound on it
    objective_unit: ObjectiveUnit | None = None
    objective_value: float | None = None
    objective_bound: float | None = None


__all__ = [
    "Baselines",
    "DeviceUse",
    "GpuOnlyBaseline",
    "GreedyBaseline",
    "LinkUse",
    "Objective",
    "ObjectiveUnit",
    "Options",
    "Plan",
    "PlanRequest",
    "Pool",
    "PoolRef",
    "Pooling",
    "ProfileSetInfo",
    "Role",
    "Route",
    "SolverInfo",
    "SolverName",
    "StageKind",
    "StageRecord",
    "StageStep",
    "Status",
    "WorkloadResult",
]
