"""The tables (SQLAlchemy Core). Documents (requests, plans, diffs, reports) are JSON text encoded by
models.codec, so every database stores and returns the contract's JSON byte for byte.

The current plan of a fleet is one row of `current_plans` pointing at a complete, committed `plans` row:
promotion changes that pointer in the same transaction that inserts the plan (repository.finish_run).
"""

import sqlalchemy as sa

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# ISO 8601 UTC timestamps as text: sortable, identical on SQLite and PostgreSQL
Stamp = sa.String(40)

fleets = sa.Table(
    "fleets",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(128), nullable=False, unique=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
    sa.Column("updated_at", Stamp, nullable=False),
)

fleet_versions = sa.Table(
    "fleet_versions",
    metadata,
    sa.Column("fleet_id", sa.Integer, sa.ForeignKey("fleets.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("request", sa.Text, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
)

profile_sets = sa.Table(
    "profile_sets",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("models", sa.Text, nullable=False),
    sa.Column("devices", sa.Text, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
    sa.UniqueConstraint("name", "sha256", name="uq_profile_sets_name_sha256"),
)

plans = sa.Table(
    "plans",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("fleet_id", sa.Integer, sa.ForeignKey("fleets.id", ondelete="CASCADE"), nullable=False),
    sa.Column("fleet_version", sa.Integer, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("profile_set_id", sa.Integer, sa.ForeignKey("profile_sets.id"), nullable=False),
    sa.Column("slo_rps", sa.Float, nullable=False),
    sa.Column("cost_per_hour", sa.Float, nullable=False),
    sa.Column("solver", sa.Text, nullable=False),
    sa.Column("request", sa.Text, nullable=False),
    sa.Column("plan", sa.Text, nullable=False),
    sa.Index("ix_plans_fleet_id_id", "fleet_id", "id"),
)

current_plans = sa.Table(
    "current_plans",
    metadata,
    sa.Column("fleet_id", sa.Integer, sa.ForeignKey("fleets.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("plan_id", sa.Integer, sa.ForeignKey("plans.id"), nullable=False),
    sa.Column("promoted_at", Stamp, nullable=False),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("fleet_id", sa.Integer, sa.ForeignKey("fleets.id", ondelete="CASCADE"), nullable=False),
    sa.Column("started_at", Stamp, nullable=False),
    sa.Column("finished_at", Stamp, nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("plan_id", sa.Integer, sa.ForeignKey("plans.id"), nullable=True),
    sa.Column("previous_plan_id", sa.Integer, sa.ForeignKey("plans.id"), nullable=True),
    sa.Column("diff", sa.Text, nullable=True),
    sa.Column("forecast", sa.Text, nullable=True),
    sa.Column("gate", sa.Text, nullable=True),
    sa.Column("dry_run", sa.Boolean, nullable=False, default=False),
    # who runs it and whether it is still alive (store.leases; migration 0002)
    sa.Column("owner", sa.String(255), nullable=True),
    sa.Column("owner_key", sa.String(255), nullable=True),
    sa.Column("heartbeat_at", Stamp, nullable=True),
    sa.Index("ix_runs_fleet_id_id", "fleet_id", "id"),
)

__all__ = ["current_plans", "fleet_versions", "fleets", "metadata", "plans", "profile_sets", "runs"]
