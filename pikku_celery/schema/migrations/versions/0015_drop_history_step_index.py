"""The attempts lose ``idx_workflow_step_history_step``: since revision 0013 it leads with
the run and the step, as ``workflow_step_history_step_attempt_unique`` does, and no
statement reads a step's attempts in creation order; every read of them (by run and step,
by run and step and attempt, the foreign key's cascade from a step) is served by the
unique key. Each attempt written kept a third index up to date for nothing.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("idx_workflow_step_history_step", table_name="workflow_step_history")


def downgrade() -> None:
    op.create_index(
        "idx_workflow_step_history_step",
        "workflow_step_history",
        ["workflow_run_id", "workflow_step_id", "created_at"],
    )
