"""Where a step's message went (``workflow_step.routing``) and the task that took over an
attempt's task id when Celery replaced it (``workflow_step_history.replaced_by``).

On PostgreSQL the read-only ``pikku_compat`` views show the new columns too
(every column of each table, in order, JSON as text).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_HISTORY_COLUMNS: Final = """
    history_id, workflow_step_id, status,
    CAST(result AS text) AS result, CAST(error AS text) AS error,
    attempt, created_at, running_at, scheduled_at, succeeded_at, failed_at,
    task_id, worker, pid, delivery_count, eta, reason"""
_STEP_COLUMNS: Final = """
    workflow_step_id, workflow_run_id, step_name, rpc_name,
    CAST(data AS text) AS data, status,
    CAST(result AS text) AS result, CAST(error AS text) AS error,
    child_run_id, branch_taken, retries, retry_delay, from_step_name, current_attempt,
    created_at, updated_at"""
_STEP_READ_ONLY: Final = (
    "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_step FOR EACH ROW EXECUTE FUNCTION pikku_compat.refuse_write()"
)
_HISTORY_READ_ONLY: Final = (
    "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_step_history FOR EACH ROW "
    "EXECUTE FUNCTION pikku_compat.refuse_write()"
)
_STEP_VIEW_NOW: Final = (
    f"CREATE OR REPLACE VIEW pikku_compat.workflow_step AS SELECT{_STEP_COLUMNS}, "
    "CAST(routing AS text) AS routing FROM workflow_step"
)
_HISTORY_VIEW_NOW: Final = (
    "CREATE OR REPLACE VIEW pikku_compat.workflow_step_history AS SELECT"
    f"{_HISTORY_COLUMNS}, replaced_by FROM workflow_step_history"
)
_STEP_VIEW_BEFORE: Final = (
    f"CREATE VIEW pikku_compat.workflow_step AS SELECT{_STEP_COLUMNS} FROM workflow_step"
)
_HISTORY_VIEW_BEFORE: Final = (
    "CREATE VIEW pikku_compat.workflow_step_history AS SELECT"
    f"{_HISTORY_COLUMNS} FROM workflow_step_history"
)
JSON = sa.Text().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("workflow_step") as batch:
        batch.add_column(sa.Column("routing", JSON))
    with op.batch_alter_table("workflow_step_history") as batch:
        batch.add_column(sa.Column("replaced_by", sa.Text))
    if op.get_bind().dialect.name == "postgresql":
        # A view may gain columns at its end in place; its trigger stays.
        op.execute(_STEP_VIEW_NOW)
        op.execute(_HISTORY_VIEW_NOW)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # A view cannot lose columns in place: made again as revision 0005 made it.
        op.execute("DROP VIEW pikku_compat.workflow_step")
        op.execute(_STEP_VIEW_BEFORE)
        op.execute(_STEP_READ_ONLY)
        op.execute("DROP VIEW pikku_compat.workflow_step_history")
        op.execute(_HISTORY_VIEW_BEFORE)
        op.execute(_HISTORY_READ_ONLY)
    with op.batch_alter_table("workflow_step_history") as batch:
        batch.drop_column("replaced_by")
    with op.batch_alter_table("workflow_step") as batch:
        batch.drop_column("routing")
