"""The repository: fleets, profile sets, plans and runs in and out of the database as models' Structs.

Every method is one transaction. Writes begin as writers (BEGIN IMMEDIATE on SQLite; the fleet row locked
FOR UPDATE on PostgreSQL), so two writes to one fleet queue instead of interleaving. Reads see one snapshot
(SQLite's WAL; REPEATABLE READ on PostgreSQL). `finish_run` is the promotion: the new plan row, the previous
plan's state, the current-plan pointer and the run's outcome are written in one transaction, so a reader
(or a crash) sees either all of it or none of it.

One re-plan of a fleet at a time: `start_run` marks the fleet's abandoned runs `failed` (store.leases) and
refuses a run while another is alive; `finish_run` promotes only over the plan its run started from.
"""

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from fleetplan.models.base import Name
from fleetplan.models.codec import decode, encode
from fleetplan.models.errors import InputError, NotFound, StoreUnavailable
from fleetplan.models.plan import Plan, PlanRequest
from fleetplan.models.store import (
    Diff,
    FleetRecord,
    ForecastReport,
    GateReport,
    PlanRecord,
    ProfileSetRecord,
    Run,
    RunStatus,
)
from fleetplan.store.engine import (
    DATABASE_ERRORS,
    WRITE_OPTION,
    current_revision,
    head_revision,
    is_unavailable,
    known_revision,
    make_engine,
    masked,
    unavailable,
)
from fleetplan.store.leases import HEARTBEAT_S, RUN_LEASE_S, abandoned_reason, owner, utc_now
from fleetplan.store.records import plan_record, plan_select, profile_set_record, run_record, run_select
from fleetplan.store.tables import current_plans, fleet_versions, fleets, plans, profile_sets, runs

MAX_PAGE = 500
log = logging.getLogger(__name__)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _json(obj: Any) -> str:
    return encode(obj).decode()


def unknown_fleet(name: str) -> str:
    """The message for a fleet the store does not have, with both ways to create it (CLI and HTTP)."""
    return f"unknown fleet {name!r}; create it with 'fleetplan fleet put {name} FILE' or PUT /fleets/{name}"


class Repository:
    """Fleets, plans and runs in one database (`engine`; default: store.engine.make_engine()). A running
    run refreshes its heartbeat every `heartbeat_s` and is abandoned after `lease_s` without one."""

    def __init__(
        self, engine: Engine | None = None, *, lease_s: float = RUN_LEASE_S, heartbeat_s: float = HEARTBEAT_S
    ) -> None:
        self.engine = engine or make_engine()
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s

    @classmethod
    def from_url(cls, url: str | None = None) -> "Repository":
        return cls(make_engine(url))

    def check_migrated(self) -> None:
        """Raise StoreUnavailable unless the database is reachable and at the newest revision."""
        try:
            at, head = current_revision(self.engine), head_revision(self.engine)
        except DATABASE_ERRORS as error:
            raise unavailable(self.engine, "read", error) from error
        if at != head:
            fix = (
                "run `fleetplan db upgrade`"
                if known_revision(self.engine, at)
                else "a newer fleetplan migrated it: upgrade fleetplan"
            )
            msg = f"database {masked(self.engine.url)} at revision {at}, code expects {head}; {fix}"
            raise StoreUnavailable(msg)

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """A read transaction on one snapshot (PostgreSQL's default, READ COMMITTED, would let two selects
        of one read see two different commits)."""
        options = {"isolation_level": "REPEATABLE READ"} if self.engine.dialect.name == "postgresql" else {}
        try:
            with self.engine.connect().execution_options(**options) as connection, connection.begin():
                yield connection
        except sa.exc.DBAPIError as error:
            if not is_unavailable(error):
                raise
            raise StoreUnavailable(f"database error: {error.orig}") from error

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        try:
            with self.engine.connect().execution_options(**{WRITE_OPTION: True}) as connection:
                with connection.begin():
                    yield connection
        except sa.exc.DBAPIError as error:
            if not is_unavailable(error):
                raise
            raise StoreUnavailable(f"database error: {error.orig}") from error

    # ---- fleets -----------------------------------------------------------------------------------

    def put_fleet(self, name: str, request: PlanRequest) -> FleetRecord:
        """Store `request` as fleet `name`: a new fleet at version 1, a changed request as the next
        version, an identical request unchanged.

        Two writers creating the same new fleet at once (on PostgreSQL there is no row to lock yet): the
        second's insert breaks the unique name and rolls back; it is tried once more, and then finds the
        fleet and takes the update path."""
        name = check_fleet_name(name)
        try:
            return self._put_fleet(name, request)
        except sa.exc.IntegrityError:
            return self._put_fleet(name, request)

    def _put_fleet(self, name: str, request: PlanRequest) -> FleetRecord:
        body = _json(request)
        stamp = now()
        with self._write() as db:
            row = _fleet_row(db, name, lock=True)
            if row is None:
                fleet_id = db.execute(
                    fleets.insert().values(name=name, version=1, created_at=stamp, updated_at=stamp)
                ).inserted_primary_key[0]
                version = 1
            else:
                fleet_id, version = row.id, row.version
                latest = db.execute(
                    sa.select(fleet_versions.c.request).where(
                        fleet_versions.c.fleet_id == fleet_id, fleet_versions.c.version == version
                    )
                ).scalar_one()
                if latest == body:
                    return self._fleet_record(db, name)
                version += 1
                db.execute(
                    fleets.update().where(fleets.c.id == fleet_id).values(version=version, updated_at=stamp)
                )
            db.execute(
                fleet_versions.insert().values(
                    fleet_id=fleet_id, version=version, request=body, created_at=stamp
                )
            )
            return self._fleet_record(db, name)

    def get_fleet(self, name: str) -> FleetRecord:
        with self._read() as db:
            return self._fleet_record(db, name)

    def list_fleets(self, limit: int = 100, offset: int = 0) -> list[FleetRecord]:
        with self._read() as db:
            names = db.execute(
                sa.select(fleets.c.name).order_by(fleets.c.name).limit(_page(limit)).offset(max(offset, 0))
            ).scalars()
            return [self._fleet_record(db, n) for n in list(names)]

    def _fleet_record(self, db: Connection, name: str) -> FleetRecord:
        row = db.execute(
            sa.select(fleets, fleet_versions.c.request)
            .join(
                fleet_versions,
                (fleet_versions.c.fleet_id == fleets.c.id) & (fleet_versions.c.version == fleets.c.version),
            )
            .where(fleets.c.name == name)
        ).one_or_none()
        if row is None:
            raise NotFound(unknown_fleet(name), field="name")
        return FleetRecord(
            name=row.name,
            version=row.version,
            request=decode(row.request, PlanRequest),
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    # ---- plans ------------------------------------------------------------------------------------

    def list_plans(self, fleet: str, limit: int = 20, offset: int = 0) -> list[PlanRecord]:
        """The fleet's plans, newest first."""
        with self._read() as db:
            rows = _newest_first(db, plan_select(), plans, _fleet_id(db, fleet), limit, offset)
            return [plan_record(r) for r in rows]

    def get_plan(self, plan_id: int) -> PlanRecord:
        with self._read() as db:
            row = db.execute(plan_select().where(plans.c.id == plan_id)).one_or_none()
            if row is None:
                raise NotFound(f"no plan with id {plan_id}", field="id")
            return plan_record(row)

    def current_plan(self, fleet: str) -> PlanRecord | None:
        """The fleet's current plan, or None before its first promotion."""
        with self._read() as db:
            fleet_id = _fleet_id(db, fleet)
            row = db.execute(
                plan_select()
                .join(current_plans, current_plans.c.plan_id == plans.c.id)
                .where(current_plans.c.fleet_id == fleet_id)
            ).one_or_none()
            return None if row is None else plan_record(row)

    # ---- runs -------------------------------------------------------------------------------------

    def start_run(self, fleet: str, *, dry_run: bool = False) -> Run:
        """Record a run as `running`, with its owner and the plan in force as the plan it starts from
        (committed at once). The fleet's abandoned runs are marked `failed` first; while another run of
        the fleet is alive, the new one is recorded as `failed` at once ("refused: ...") and returned so."""
        readable, key = owner()
        with self._write() as db:
            row = _fleet_row(db, fleet, lock=True)
            if row is None:
                raise NotFound(unknown_fleet(fleet), field="name")
            fleet_id = int(row.id)
            alive = [r for r in _running(db, fleet_id) if not self._reaped(db, r)]
            stamp = now()
            values: dict[str, Any] = dict(
                fleet_id=fleet_id,
                started_at=stamp,
                status="running",
                dry_run=dry_run,
                owner=readable,
                owner_key=key,
                heartbeat_at=stamp,
                previous_plan_id=_pointer(db, fleet_id),
            )
            if alive:
                other = alive[0]
                values.update(
                    status="failed",
                    finished_at=stamp,
                    reason=(
                        f"refused: run {other.id} of fleet {fleet} is still running ({other.owner}, started "
                        f"{other.started_at}, last heartbeat {other.heartbeat_at}); one re-plan of a fleet "
                        "at a time"
                    ),
                )
            run_id = db.execute(runs.insert().values(**values)).inserted_primary_key[0]
            return run_record(db.execute(run_select().where(runs.c.id == run_id)).one())

    def _reaped(self, db: Connection, row) -> bool:
        """Mark the running run `row` `failed` if it is abandoned (store.leases); True when it was."""
        reason = abandoned_reason(row, utc_now(), self.lease_s)
        if reason is None:
            return False
        db.execute(
            runs.update()
            .where(runs.c.id == row.id, runs.c.status == "running")
            .values(status="failed", finished_at=now(), reason=reason)
        )
        log.warning("run %s of fleet id %s marked failed: %s", row.id, row.fleet_id, reason)
        return True

    def reap_abandoned(self, fleet: str) -> list[int]:
        """Mark the fleet's abandoned running runs `failed` with the reason; their ids. Reads first, and
        writes only when there is one to mark."""
        with self._read() as db:
            stale = [
                r for r in _running(db, _fleet_id(db, fleet)) if abandoned_reason(r, utc_now(), self.lease_s)
            ]
        if not stale:
            return []
        with self._write() as db:
            return [int(r.id) for r in _running(db, _fleet_id(db, fleet), lock=True) if self._reaped(db, r)]

    @contextmanager
    def heartbeat(self, run_id: int) -> Iterator[None]:
        """Refresh the run's heartbeat every `heartbeat_s` from a daemon thread while the block runs."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_s):
                try:
                    with self._write() as db:
                        db.execute(
                            runs.update()
                            .where(runs.c.id == run_id, runs.c.status == "running")
                            .values(heartbeat_at=now())
                        )
                except (StoreUnavailable, sa.exc.SQLAlchemyError) as error:  # the next beat tries again
                    log.warning("heartbeat of run %s failed: %s", run_id, error)

        thread = threading.Thread(target=beat, name=f"fleetplan-run-{run_id}-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def finish_run(
        self,
        run_id: int,
        *,
        status: RunStatus,
        reason: str | None,
        plan: tuple[PlanRequest, int, Plan, ProfileSetRecord] | None = None,
        promote: bool = False,
        diff: Diff | None = None,
        forecast: ForecastReport | None = None,
        gate: GateReport | None = None,
    ) -> Run:
        """Finish a run in one transaction: store its plan (request, fleet version, plan, profile set) if
        any, as `current` when `promote` (the previous current plan becomes `superseded` and the pointer
        moves) or else as `candidate`, and record status, reason, diff, forecast and gate.

        A run promotes (or is `unchanged`) only while it is still `running`, the fleet's current plan is
        the one it started from and its plan was made for the fleet's current version; otherwise (another
        run promoted meanwhile, this one was declared abandoned, or the fleet was edited while it computed)
        it is `kept`, its plan stored as a candidate, and the reason says so."""
        with self._write() as db:
            row = db.execute(sa.select(runs).where(runs.c.id == run_id)).one_or_none()
            if row is None:
                raise NotFound(f"no run with id {run_id}", field="id")
            version = _lock_fleet(db, row.fleet_id)
            previous = _pointer(db, row.fleet_id)
            conflict = _conflict(row, previous) or _stale(plan, version)
            if conflict and status in ("promoted", "unchanged"):
                status, reason, promote = "kept", f"not promoted: {conflict}; re-plan again", False
            plan_id = None
            if plan is not None:
                plan_id = _insert_plan(db, row.fleet_id, plan, "current" if promote else "candidate")
                if promote:
                    _point_current(db, row.fleet_id, plan_id, previous)
            elif status == "unchanged":
                plan_id = previous
            db.execute(
                runs.update()
                .where(runs.c.id == run_id)
                .values(
                    finished_at=now(),
                    status=status,
                    reason=reason,
                    plan_id=plan_id,
                    previous_plan_id=previous,
                    diff=None if diff is None else _json(diff),
                    forecast=None if forecast is None else _json(forecast),
                    gate=None if gate is None else _json(gate),
                )
            )
            return run_record(db.execute(run_select().where(runs.c.id == run_id)).one())

    def get_run(self, run_id: int) -> Run:
        """One run; a running one past its lease (or whose process is gone) is marked `failed` first."""
        row = self._run_row(run_id)
        if row.status == "running" and abandoned_reason(row, utc_now(), self.lease_s):
            self.reap_abandoned(row.fleet)
            row = self._run_row(run_id)
        return run_record(row)

    def _run_row(self, run_id: int):
        with self._read() as db:
            row = db.execute(run_select().where(runs.c.id == run_id)).one_or_none()
        if row is None:
            raise NotFound(f"no run with id {run_id}", field="id")
        return row

    def list_runs(self, fleet: str, limit: int = 20, offset: int = 0) -> list[Run]:
        """The fleet's runs, newest first; abandoned running runs are marked `failed` first."""
        self.reap_abandoned(fleet)
        with self._read() as db:
            rows = _newest_first(db, run_select(), runs, _fleet_id(db, fleet), limit, offset)
            return [run_record(r) for r in rows]

    def list_profile_sets(self) -> list[ProfileSetRecord]:
        with self._read() as db:
            rows = db.execute(sa.select(profile_sets).order_by(profile_sets.c.id)).all()
            return [profile_set_record(r) for r in rows]


def check_fleet_name(name: str) -> str:
    """A fleet's name follows the rules of every name in a request, without "/": it is one path segment
    of /fleets/{name} (a fleet `a/b` put by the CLI could never be reached over HTTP). InputError naming
    the field "name"."""
    try:
        checked = msgspec.convert(name, Name)
    except msgspec.ValidationError as error:
        raise InputError(str(error), field="name") from error
    if "/" in checked:
        msg = f"{name!r}: a fleet's name cannot hold '/' (it is one path segment of /fleets/{{name}})"
        raise InputError(msg, field="name")
    return checked


def _newest_first(db, query, table, fleet_id: int, limit: int, offset: int) -> list:
    """One page of a fleet's rows of `table` (plans, runs), newest first."""
    query = query.where(table.c.fleet_id == fleet_id).order_by(table.c.id.desc())
    return db.execute(query.limit(_page(limit)).offset(max(offset, 0))).all()


def _page(limit: int) -> int:
    return min(max(int(limit), 1), MAX_PAGE)


def _fleet_row(db: Connection, name: str, *, lock: bool = False):
    query = sa.select(fleets.c.id, fleets.c.version).where(fleets.c.name == name)
    return db.execute(query.with_for_update() if lock else query).one_or_none()


def _fleet_id(db: Connection, name: str) -> int:
    row = _fleet_row(db, name)
    if row is None:
        raise NotFound(unknown_fleet(name), field="name")
    return int(row.id)


def _running(db: Connection, fleet_id: int, *, lock: bool = False) -> list:
    query = sa.select(runs).where(runs.c.fleet_id == fleet_id, runs.c.status == "running").order_by(runs.c.id)
    return list(db.execute(query.with_for_update() if lock else query).all())


def _pointer(db: Connection, fleet_id: int) -> int | None:
    """The id of the fleet's current plan (None before its first promotion)."""
    return db.execute(
        sa.select(current_plans.c.plan_id).where(current_plans.c.fleet_id == fleet_id)
    ).scalar_one_or_none()


def _conflict(row, pointer: int | None) -> str | None:
    """Why the run in `row` may not promote now, or None: it was marked finished meanwhile (declared
    abandoned), or the current plan is no longer the one it started from."""
    if row.status != "running":
        return f"this run was marked {row.status} while it computed ({row.reason})"
    if pointer != row.previous_plan_id:
        return f"plan {pointer} became current while this run computed from plan {row.previous_plan_id}"
    return None


def _stale(plan: tuple | None, version: int) -> str | None:
    """Why a run's plan may not promote because its fleet changed while it computed, or None."""
    if plan is not None and plan[1] != version:
        return f"the fleet changed while this run computed (version {plan[1]} -> {version})"
    return None


def _lock_fleet(db: Connection, fleet_id: int) -> int:
    """Serialize promotions of one fleet (FOR UPDATE on PostgreSQL; SQLite writers are serial anyway);
    returns the fleet's current version."""
    query = sa.select(fleets.c.version).where(fleets.c.id == fleet_id).with_for_update()
    return int(db.execute(query).scalar_one())


def _profile_set_id(db: Connection, record: ProfileSetRecord) -> int:
    found = db.execute(
        sa.select(profile_sets.c.id).where(
            profile_sets.c.name == record.name, profile_sets.c.sha256 == record.sha256
        )
    ).scalar_one_or_none()
    if found is not None:
        return int(found)
    return int(
        db.execute(
            profile_sets.insert().values(
                name=record.name,
                sha256=record.sha256,
                models=_json(record.models),
                devices=_json(record.devices),
                created_at=record.created_at,
            )
        ).inserted_primary_key[0]
    )


def _insert_plan(
    db: Connection, fleet_id: int, plan: tuple[PlanRequest, int, Plan, ProfileSetRecord], state: str
) -> int:
    request, version, result, profile_set = plan
    return int(
        db.execute(
            plans.insert().values(
                fleet_id=fleet_id,
                fleet_version=version,
                created_at=now(),
                state=state,
                status=result.status,
                profile_set_id=_profile_set_id(db, profile_set),
                slo_rps=result.slo_rps,
                cost_per_hour=result.cost_per_hour,
                solver=_json(result.solver),
                request=_json(request),
                plan=_json(result),
            )
        ).inserted_primary_key[0]
    )


def _point_current(db: Connection, fleet_id: int, plan_id: int, previous: int | None) -> None:
    """Move the fleet's current-plan pointer to `plan_id`; the previous current plan is superseded."""
    stamp = now()
    if previous is None:
        db.execute(current_plans.insert().values(fleet_id=fleet_id, plan_id=plan_id, promoted_at=stamp))
        return
    db.execute(plans.update().where(plans.c.id == previous).values(state="superseded"))
    db.execute(
        current_plans.update()
        .where(current_plans.c.fleet_id == fleet_id)
        .values(plan_id=plan_id, promoted_at=stamp)
    )


__all__ = ["MAX_PAGE", "Repository", "now"]
