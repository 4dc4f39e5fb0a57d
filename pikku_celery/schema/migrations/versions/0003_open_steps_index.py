"""A partial index over unfinished steps, for the stuck-attempt reaper.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Written out rather than imported: a migration keeps the SQL it shipped with.
_CONDITION = "status IN ('scheduled', 'running', 'lost')"


def upgrade() -> None:
    op.create_index(
        "idx_workflow_step_open",
        "workflow_step",
        ["status", "updated_at"],
        postgresql_where=sa.text(_CONDITION),
        sqlite_where=sa.text(_CONDITION),
    )


def downgrade() -> None:
    op.drop_index("idx_workflow_step_open", table_name="workflow_step")
