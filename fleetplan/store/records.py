"""Rows <-> models' Structs: the selects that read plans and runs, and the records built from their rows."""

from typing import Any

import msgspec
import sqlalchemy as sa

from fleetplan.models.codec import decode
from fleetplan.models.plan import Plan, PlanRequest, ProfileSetInfo
from fleetplan.models.store import Diff, ForecastReport, GateReport, PlanRecord, ProfileSetRecord, Run
from fleetplan.store.tables import fleets, plans, profile_sets, runs


def plan_select() -> sa.Select:
    return sa.select(
        plans,
        fleets.c.name.label("fleet"),
        profile_sets.c.name.label("profile_name"),
        profile_sets.c.sha256.label("profile_sha256"),
    ).select_from(
        plans.join(fleets, fleets.c.id == plans.c.fleet_id).join(
            profile_sets, profile_sets.c.id == plans.c.profile_set_id
        )
    )


def plan_record(row) -> PlanRecord:
    return PlanRecord(
        id=row.id,
        fleet=row.fleet,
        fleet_version=row.fleet_version,
        created_at=row.created_at,
        state=row.state,
        profile_set=ProfileSetInfo(name=row.profile_name, sha256=row.profile_sha256),
        slo_rps=row.slo_rps,
        cost_per_hour=row.cost_per_hour,
        request=decode(row.request, PlanRequest),
        plan=decode(row.plan, Plan),
    )


def run_select() -> sa.Select:
    return sa.select(runs, fleets.c.name.label("fleet")).select_from(
        runs.join(fleets, fleets.c.id == runs.c.fleet_id)
    )


def _optional(text: str | None, type_: type) -> Any:
    return None if text is None else decode(text, type_)


def run_record(row) -> Run:
    return Run(
        id=row.id,
        fleet=row.fleet,
        started_at=row.started_at,
        finished_at=row.finished_at,
        status=row.status,
        reason=row.reason,
        plan_id=row.plan_id,
        previous_plan_id=row.previous_plan_id,
        diff=_optional(row.diff, Diff),
        forecast=_optional(row.forecast, ForecastReport),
        gate=_optional(row.gate, GateReport),
        dry_run=bool(row.dry_run),
    )


def profile_set_record(row) -> ProfileSetRecord:
    return ProfileSetRecord(
        name=row.name,
        sha256=row.sha256,
        models=msgspec.json.decode(row.models),
        devices=msgspec.json.decode(row.devices),
        created_at=row.created_at,
    )


__all__ = ["plan_record", "plan_select", "profile_set_record", "run_record", "run_select"]
