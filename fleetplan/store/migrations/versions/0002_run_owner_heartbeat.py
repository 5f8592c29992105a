"""Runs record their owner and a heartbeat, so a run whose process was killed can be told from one still
computing (store.leases): owner ("pid 4242 on host-a"), owner_key (boot, PID namespace, pid, start time),
heartbeat_at. Existing runs get heartbeat_at = started_at: a run left `running` by a process killed before
this revision is past its lease at once.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

STAMP = sa.String(40)


def upgrade() -> None:
    op.add_column("runs", sa.Column("owner", sa.String(255), nullable=True))
    op.add_column("runs", sa.Column("owner_key", sa.String(255), nullable=True))
    op.add_column("runs", sa.Column("heartbeat_at", STAMP, nullable=True))
    runs = sa.table("runs", sa.column("started_at", STAMP), sa.column("heartbeat_at", STAMP))
    op.execute(runs.update().values(heartbeat_at=runs.c.started_at))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("heartbeat_at")
        batch.drop_column("owner_key")
        batch.drop_column("owner")
