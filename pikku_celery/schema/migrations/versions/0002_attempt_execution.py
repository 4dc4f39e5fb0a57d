"""Where and how each attempt ran: Celery task id, worker, pid, deliveries, ETA, reason.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("workflow_step_history") as batch:
        batch.add_column(sa.Column("task_id", sa.Text))
        batch.add_column(sa.Column("worker", sa.Text))
        batch.add_column(sa.Column("pid", sa.Integer))
        batch.add_column(
            sa.Column("delivery_count", sa.Integer, nullable=False, server_default=sa.text("0"))
        )
        batch.add_column(sa.Column("eta", TS))
        batch.add_column(sa.Column("reason", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("workflow_step_history") as batch:
        for column in ("reason", "eta", "delivery_count", "pid", "worker", "task_id"):
            batch.drop_column(column)
