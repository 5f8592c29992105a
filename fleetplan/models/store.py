"""Fleets, stored plans, re-plan requests and runs (the store and the nightly re-plan; docs/store.md).

The JSON names are the contract's ("Fleets, plans and runs" in the API contract): FLEET, REPLAN, RUN, DIFF.
"""

from typing import Annotated, Literal

import msgspec

from fleetplan.models.base import Base, Count, Name, Rps, Total
from fleetplan.models.plan import Plan, PlanRequest, ProfileSetInfo
from fleetplan.models.profile import ProfilesSpec

RunStatus = Literal["running", "promoted", "unchanged", "kept", "failed"]
PlanState = Literal["current", "superseded", "candidate"]
TrafficSource = Literal["azure_csv", "mooncake_jsonl", "rates_csv"]
ForecastMethod = Literal["constant", "ewma", "seasonal_naive", "ets"]
Quantile = Annotated[float, msgspec.Meta(ge=0, le=1)]


class FleetRecord(Base):
    """A named PlanRequest; `version` grows by one on every change (a PUT of the same request keeps it)."""

    name: Name
    version: Annotated[int, msgspec.Meta(ge=1)]
    request: PlanRequest
    created_at: str
    updated_at: str


class ProfileSetRecord(Base):
    """A profile set a plan was made with: its name, content hash, and which models and devices it covers."""

    name: str
    sha256: str
    models: list[str]
    devices: list[str]
    created_at: str


class PlanRecord(Base):
    """A stored plan: the request it answered (fleet version), the plan, its profile set and its state.

    `state` is "current" for the one plan per fleet operators should run, "superseded" once a newer plan was
    promoted, "candidate" for a plan a run computed but did not promote (a failed gate, a dry run).
    """

    id: int
    fleet: Name
    fleet_version: int
    created_at: str
    state: PlanState
    profile_set: ProfileSetInfo
    slo_rps: Total
    cost_per_hour: Total
    request: PlanRequest
    plan: Plan


class TrafficSpec(Base):
    """Observed traffic: a file in one of the three formats (docs/store.md, "Traffic")."""

    source: TrafficSource
    path: str
    # width of the bins the rates are counted in (a rates CSV is resampled to it)
    interval_s: Annotated[float, msgspec.Meta(gt=0, le=7 * 86400)] = 3600.0


class ForecastSpec(Base):
    """How each class's rate for the next `horizon_h` hours is forecast: the planned rate is the
    `quantile` of the method's forecast over the horizon's bins (docs/store.md, "Forecast")."""

    method: ForecastMethod = "seasonal_naive"
    horizon_h: Annotated[float, msgspec.Meta(gt=0, le=24 * 31)] = 24.0
    quantile: Quantile = 0.95
    # EWMA smoothing factor (weight of the newest bin)
    alpha: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.3


class GateSpec(Base):
    """The simulation gate: the new plan must keep its promise (every served class meets its SLO
    percentile) on seeds 0..seeds-1 at the forecast rates before it may become current."""

    simulate: bool = True
    seeds: Annotated[int, msgspec.Meta(ge=1, le=20)] = 3
    duration_s: Annotated[float, msgspec.Meta(gt=0, le=7200)] = 600.0
    warmup_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 60.0


class ReplanRequest(Base):
    """REPLAN: every field optional. `profiles` null takes the newest stored profile set strictly newer
    than the fleet's own that covers its models and devices, else re-reads the fleet's own (its newest
    stored version; inline rows as they are); `traffic` null keeps the fleet's rates; `gate` null is the
    default gate (GateSpec()); `dry_run` computes and records the run but never promotes."""

    profiles: ProfilesSpec | None = None
    traffic: TrafficSpec | None = None
    forecast: ForecastSpec | None = None
    max_moves: Count | None = None
    churn_penalty: Annotated[float, msgspec.Meta(ge=0, le=1e6)] | None = None
    gate: GateSpec | None = None
    dry_run: bool = False


class Change(Base):
    before: float
    after: float


class PoolChange(Base):
    """Instances of one (model, role, device, tp, batch) before and after (groups summed)."""

    model: Name
    role: str
    device: Name
    tp: int
    batch: int
    before: Count
    after: Count


class DeviceChange(Base):
    name: Name
    before: Count
    after: Count


class ClassChange(Base):
    """A class whose served RPS changed, and why (the new plan's reason, or what changed in its demand)."""

    name: Name
    served_before: Rps
    served_after: Rps
    why: str


class Diff(Base):
    """What operators change to go from the current plan to the new one; unchanged: moves 0, empty lists."""

    moves: Count
    pools: list[PoolChange]
    devices: list[DeviceChange]
    slo_rps: Change
    cost_per_hour: Change
    classes: list[ClassChange]


class ClassForecast(Base):
    """One class: the observed rate per bin (oldest first) and the rate planned for the horizon."""

    name: Name
    history_rps: list[float]
    forecast_rps: list[float]
    planned_rps: Rps
    previous_rps: Rps


class ForecastReport(Base):
    method: ForecastMethod
    horizon_h: float
    quantile: float
    interval_s: float
    rows: Count
    unmapped_rows: Count
    classes: list[ClassForecast]
    notes: list[str] = []


class GateSeed(Base):
    """One seed's verdict: `failing` describes each served class that broke its SLO; `thin` names each served
    class whose percentile rested on fewer than `fleetplan.replan.gate.THIN_TAIL` (50) measured requests
    beyond it, whose verdict, passed or failed, is then mostly the window's noise (docs/simulation.md, "How
    long a gate must simulate")."""

    seed: int
    passed: bool
    failing: list[str]
    thin: list[str] = []


class GateReport(Base):
    """The simulation gate's verdict; `failing` names each served class that broke its SLO, per seed."""

    simulated: bool
    passed: bool
    duration_s: float
    seeds: list[GateSeed]


class Run(Base):
    """RUN: one re-plan of one fleet and its outcome."""

    id: int
    fleet: Name
    started_at: str
    finished_at: str | None
    status: RunStatus
    reason: str | None
    plan_id: int | None
    previous_plan_id: int | None
    diff: Diff | None
    forecast: ForecastReport | None
    gate: GateReport | None
    dry_run: bool = False


__all__ = [
    "Change",
    "ClassChange",
    "ClassForecast",
    "DeviceChange",
    "Diff",
    "FleetRecord",
    "ForecastMethod",
    "ForecastReport",
    "ForecastSpec",
    "GateReport",
    "GateSeed",
    "GateSpec",
    "PlanRecord",
    "PlanState",
    "PoolChange",
    "ProfileSetRecord",
    "ReplanRequest",
    "Run",
    "RunStatus",
    "TrafficSource",
    "TrafficSpec",
]
