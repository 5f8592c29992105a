"""The first schema: fleets (versioned requests), profile sets, plans, the current-plan pointer, runs.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STAMP = sa.String(40)


def upgrade() -> None:
    op.create_table(
        "fleets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_at", STAMP, nullable=False),
        sa.Column("updated_at", STAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fleets"),
        sa.UniqueConstraint("name", name="uq_fleets_name"),
    )
    op.create_table(
        "fleet_versions",
        sa.Column("fleet_id", sa.Integer, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("created_at", STAMP, nullable=False),
        sa.PrimaryKeyConstraint("fleet_id", "version", name="pk_fleet_versions"),
        sa.ForeignKeyConstraint(
            ["fleet_id"], ["fleets.id"], ondelete="CASCADE", name="fk_fleet_versions_fleet_id_fleets"
        ),
    )
    op.create_table(
        "profile_sets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("models", sa.Text, nullable=False),
        sa.Column("devices", sa.Text, nullable=False),
        sa.Column("created_at", STAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_profile_sets"),
        sa.UniqueConstraint("name", "sha256", name="uq_profile_sets_name_sha256"),
    )
    op.create_table(
        "plans",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("fleet_id", sa.Integer, nullable=False),
        sa.Column("fleet_version", sa.Integer, nullable=False),
        sa.Column("created_at", STAMP, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("profile_set_id", sa.Integer, nullable=False),
        sa.Column("slo_rps", sa.Float, nullable=False),
        sa.Column("cost_per_hour", sa.Float, nullable=False),
        sa.Column("solver", sa.Text, nullable=False),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("plan", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_plans"),
        sa.ForeignKeyConstraint(
            ["fleet_id"], ["fleets.id"], ondelete="CASCADE", name="fk_plans_fleet_id_fleets"
        ),
        sa.ForeignKeyConstraint(
            ["profile_set_id"], ["profile_sets.id"], name="fk_plans_profile_set_id_profile_sets"
        ),
    )
    op.create_index("ix_plans_fleet_id_id", "plans", ["fleet_id", "id"])
    op.create_table(
        "current_plans",
        sa.Column("fleet_id", sa.Integer, nullable=False),
        sa.Column("plan_id", sa.Integer, nullable=False),
        sa.Column("promoted_at", STAMP, nullable=False),
        sa.PrimaryKeyConstraint("fleet_id", name="pk_current_plans"),
        sa.ForeignKeyConstraint(
            ["fleet_id"], ["fleets.id"], ondelete="CASCADE", name="fk_current_plans_fleet_id_fleets"
        ),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name="fk_current_plans_plan_id_plans"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("fleet_id", sa.Integer, nullable=False),
        sa.Column("started_at", STAMP, nullable=False),
        sa.Column("finished_at", STAMP, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("plan_id", sa.Integer, nullable=True),
        sa.Column("previous_plan_id", sa.Integer, nullable=True),
        sa.Column("diff", sa.Text, nullable=True),
        sa.Column("forecast", sa.Text, nullable=True),
        sa.Column("gate", sa.Text, nullable=True),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.ForeignKeyConstraint(
            ["fleet_id"], ["fleets.id"], ondelete="CASCADE", name="fk_runs_fleet_id_fleets"
        ),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name="fk_runs_plan_id_plans"),
        sa.ForeignKeyConstraint(["previous_plan_id"], ["plans.id"], name="fk_runs_previous_plan_id_plans"),
    )
    op.create_index("ix_runs_fleet_id_id", "runs", ["fleet_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_runs_fleet_id_id", table_name="runs")
    op.drop_table("runs")
    op.drop_table("current_plans")
    op.drop_index("ix_plans_fleet_id_id", table_name="plans")
    op.drop_table("plans")
    op.drop_table("profile_sets")
    op.drop_table("fleet_versions")
    op.drop_table("fleets")
