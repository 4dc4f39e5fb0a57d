"""The chords of a run whose body is not out yet (``pikku_celery_chords``): they hold the
run open, so a run is not completed between its chord's header and its body.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Frozen copy of the column type as it was at this revision.
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "pikku_celery_chords",
        sa.Column("body_id", sa.Text, nullable=False),
        sa.Column("workflow_run_id", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("body_id", name="pk_pikku_celery_chords"),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.workflow_run_id"],
            name="fk_pikku_celery_chords_workflow_run_id_workflow_runs",
            ondelete="CASCADE",
        ),
    )
    op.create_index("idx_pikku_celery_chords_run", "pikku_celery_chords", ["workflow_run_id"])


def downgrade() -> None:
    op.drop_index("idx_pikku_celery_chords_run", table_name="pikku_celery_chords")
    op.drop_table("pikku_celery_chords")
