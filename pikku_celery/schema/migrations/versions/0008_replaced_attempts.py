"""The task that took over an attempt's task id when Celery replaced it (``Task.replace``).

On PostgreSQL the read-only ``pikku_compat`` view of the history shows the new
column too (every column of the table, in order).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_HISTORY_COLUMNS: Final = """
    history_id, workflow_step_id, status,
    CAST(result AS text) AS result, CAST(error AS text) AS error,
    attempt, created_at, running_at, scheduled_at, succeeded_at, failed_at,
    task_id, worker, pid, delivery_count, eta, reason"""
_READ_ONLY: Final = (
    "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_step_history FOR EACH ROW "
    "EXECUTE FUNCTION pikku_compat.refuse_write()"
)


def upgrade() -> None:
    with op.batch_alter_table("workflow_step_history") as batch:
        batch.add_column(sa.Column("replaced_by", sa.Text))
    if op.get_bind().dialect.name == "postgresql":
        # A view may gain columns at its end in place; its trigger stays.
        op.execute(
            "CREATE OR REPLACE VIEW pikku_compat.workflow_step_history AS SELECT"
            f"{_HISTORY_COLUMNS}, replaced_by FROM workflow_step_history"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW pikku_compat.workflow_step_history")
        op.execute(
            "CREATE VIEW pikku_compat.workflow_step_history AS SELECT"
            f"{_HISTORY_COLUMNS} FROM workflow_step_history"
        )
        op.execute(_READ_ONLY)
    with op.batch_alter_table("workflow_step_history") as batch:
        batch.drop_column("replaced_by")
