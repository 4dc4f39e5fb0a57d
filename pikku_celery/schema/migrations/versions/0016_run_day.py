"""Every run-keyed table gets ``run_day``: the day (UTC) its run was made.

Every row of a run carries its run's day, copied from the run when the row is written,
so the opt-in partitioned layout (``pikku-celery db upgrade --layout partitioned``) can
range-partition the run tables by it and retire a day of history by dropping its
partitions. On the plain layout the column is only kept; rows of before this revision
leave it empty, and the partitioned layout fills it from their run when it is chosen.

On PostgreSQL the ``pikku_compat`` views of runs, steps and attempts show the new column
at their end.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_TABLES: Final = (
    "workflow_runs",
    "workflow_step",
    "workflow_step_history",
    "pikku_celery_deliveries",
    "pikku_celery_run_events",
    "pikku_celery_chords",
)

# Written out rather than read from the package: a migration keeps the SQL it shipped with.
_RUNS_COLUMNS: Final = """
    workflow_run_id, workflow, status,
    CAST(input AS text) AS input, CAST(output AS text) AS output,
    CAST(error AS text) AS error, CAST(state AS text) AS state,
    inline, graph_hash, deterministic,
    CAST(planned_steps AS text) AS planned_steps, CAST(wire AS text) AS wire,
    created_at, updated_at"""
_STEP_COLUMNS: Final = """
    workflow_step_id, workflow_run_id, step_name, rpc_name,
    CAST(data AS text) AS data, status,
    CAST(result AS text) AS result, CAST(error AS text) AS error,
    child_run_id, branch_taken, retries, retry_delay, from_step_name, current_attempt,
    created_at, updated_at, CAST(routing AS text) AS routing"""
_HISTORY_COLUMNS: Final = """
    history_id, workflow_step_id, status,
    CAST(result AS text) AS result, CAST(error AS text) AS error,
    attempt, created_at, running_at, scheduled_at, succeeded_at, failed_at,
    task_id, worker, pid, delivery_count, eta, reason, replaced_by, workflow_run_id"""
_TABLES_WITH_VIEWS: Final = ("workflow_runs", "workflow_step", "workflow_step_history")
_VIEW_NOW: Final = {
    "workflow_runs": "CREATE OR REPLACE VIEW pikku_compat.workflow_runs AS SELECT"
    + _RUNS_COLUMNS
    + ", run_day FROM workflow_runs",
    "workflow_step": "CREATE OR REPLACE VIEW pikku_compat.workflow_step AS SELECT"
    + _STEP_COLUMNS
    + ", run_day FROM workflow_step",
    "workflow_step_history": "CREATE OR REPLACE VIEW pikku_compat.workflow_step_history AS "
    "SELECT" + _HISTORY_COLUMNS + ", run_day FROM workflow_step_history",
}
_VIEW_BEFORE: Final = {
    "workflow_runs": "CREATE VIEW pikku_compat.workflow_runs AS SELECT"
    + _RUNS_COLUMNS
    + " FROM workflow_runs",
    "workflow_step": "CREATE VIEW pikku_compat.workflow_step AS SELECT"
    + _STEP_COLUMNS
    + " FROM workflow_step",
    "workflow_step_history": "CREATE VIEW pikku_compat.workflow_step_history AS SELECT"
    + _HISTORY_COLUMNS
    + " FROM workflow_step_history",
}
_DROP_VIEW: Final = {
    "workflow_runs": "DROP VIEW pikku_compat.workflow_runs",
    "workflow_step": "DROP VIEW pikku_compat.workflow_step",
    "workflow_step_history": "DROP VIEW pikku_compat.workflow_step_history",
}
_READ_ONLY: Final = {
    "workflow_runs": "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_runs FOR EACH ROW EXECUTE FUNCTION pikku_compat.refuse_write()",
    "workflow_step": "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_step FOR EACH ROW EXECUTE FUNCTION pikku_compat.refuse_write()",
    "workflow_step_history": "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE "
    "ON pikku_compat.workflow_step_history FOR EACH ROW "
    "EXECUTE FUNCTION pikku_compat.refuse_write()",
}


def _postgres() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("run_day", sa.Date()))
    if _postgres():
        for table in _TABLES_WITH_VIEWS:
            op.execute(_VIEW_NOW[table])


def downgrade() -> None:
    if _postgres():
        # A view cannot lose a column in place: made again as it was, with its trigger.
        for table in _TABLES_WITH_VIEWS:
            op.execute(_DROP_VIEW[table])
            op.execute(_VIEW_BEFORE[table])
            op.execute(_READ_ONLY[table])
    for table in reversed(_TABLES):
        # SQLite drops a column in place since 3.35: no copy of the table, whose cascading
        # foreign keys would empty its children if it were dropped to be made again.
        op.drop_column(table, "run_day")
