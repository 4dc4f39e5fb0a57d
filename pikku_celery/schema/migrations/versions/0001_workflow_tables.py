"""The four workflow tables and their indexes.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copies of the column types as they were at this revision.
JSON = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)
NOW = sa.func.current_timestamp()


def upgrade() -> None:
    op.create_table(
        "workflow_runs",
        sa.Column("workflow_run_id", sa.Text, nullable=False),
        sa.Column("workflow", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("input", JSON, nullable=False),
        sa.Column("output", JSON),
        sa.Column("error", JSON),
        sa.Column("state", JSON, nullable=False, server_default=sa.text("'{}'")),
        sa.Column("inline", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("graph_hash", sa.Text),
        sa.Column("deterministic", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("planned_steps", JSON),
        sa.Column("wire", JSON),
        sa.Column("created_at", TS, nullable=False, server_default=NOW),
        sa.Column("updated_at", TS, nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("workflow_run_id", name="pk_workflow_runs"),
    )
    op.create_index("idx_workflow_runs_status_created", "workflow_runs", ["status", "created_at"])
    op.create_index(
        "idx_workflow_runs_workflow_created", "workflow_runs", ["workflow", "created_at"]
    )

    op.create_table(
        "workflow_step",
        sa.Column("workflow_step_id", sa.Text, nullable=False),
        sa.Column("workflow_run_id", sa.Text, nullable=False),
        sa.Column("step_name", sa.Text, nullable=False),
        sa.Column("rpc_name", sa.Text),
        sa.Column("data", JSON),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'pending'")),
        sa.Column("result", JSON),
        sa.Column("error", JSON),
        sa.Column("child_run_id", sa.Text),
        sa.Column("branch_taken", sa.Text),
        sa.Column("retries", sa.Integer),
        sa.Column("retry_delay", sa.Text),
        sa.Column("from_step_name", sa.Text),
        sa.Column("current_attempt", sa.Integer),
        sa.Column("created_at", TS, nullable=False, server_default=NOW),
        sa.Column("updated_at", TS, nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("workflow_step_id", name="pk_workflow_step"),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.workflow_run_id"],
            name="fk_workflow_step_workflow_run_id_workflow_runs",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("workflow_run_id", "step_name", name="workflow_step_run_name_unique"),
    )
    op.create_index("idx_workflow_step_run_status", "workflow_step", ["workflow_run_id", "status"])

    op.create_table(
        "workflow_step_history",
        sa.Column("history_id", sa.Text, nullable=False),
        sa.Column("workflow_step_id", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("result", JSON),
        sa.Column("error", JSON),
        sa.Column("attempt", sa.Integer),
        sa.Column("created_at", TS, nullable=False, server_default=NOW),
        sa.Column("running_at", TS),
        sa.Column("scheduled_at", TS),
        sa.Column("succeeded_at", TS),
        sa.Column("failed_at", TS),
        sa.PrimaryKeyConstraint("history_id", name="pk_workflow_step_history"),
        sa.ForeignKeyConstraint(
            ["workflow_step_id"],
            ["workflow_step.workflow_step_id"],
            name="fk_workflow_step_history_workflow_step_id_workflow_step",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint(
            "workflow_step_id", "attempt", name="workflow_step_history_step_attempt_unique"
        ),
    )
    op.create_index(
        "idx_workflow_step_history_step",
        "workflow_step_history",
        ["workflow_step_id", "created_at"],
    )

    op.create_table(
        "workflow_versions",
        sa.Column("workflow_name", sa.Text, nullable=False),
        sa.Column("graph_hash", sa.Text, nullable=False),
        sa.Column("graph", JSON, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'active'")),
        sa.Column("created_at", TS, nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("workflow_name", "graph_hash", name="workflow_versions_pk"),
    )
    op.create_index(
        "idx_workflow_versions_source_status", "workflow_versions", ["source", "status"]
    )


def downgrade() -> None:
    op.drop_table("workflow_versions")
    op.drop_table("workflow_step_history")
    op.drop_table("workflow_step")
    op.drop_table("workflow_runs")
