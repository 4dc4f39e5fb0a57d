"""Events sent to runs (``pikku.send``), kept until a ``ctx.wait_for`` of their name takes one.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Frozen copies of the column types as they were at this revision.
JSON = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "pikku_celery_run_events",
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("workflow_run_id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("data", JSON),
        sa.Column("sent_at", TS, nullable=False),
        sa.Column("taken_by_step_id", sa.Text),
        sa.Column("taken_at", TS),
        sa.PrimaryKeyConstraint("event_id", name="pk_pikku_celery_run_events"),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.workflow_run_id"],
            name="fk_pikku_celery_run_events_workflow_run_id_workflow_runs",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "idx_pikku_celery_run_events_run_name",
        "pikku_celery_run_events",
        ["workflow_run_id", "name", "sent_at"],
    )


def downgrade() -> None:
    op.drop_index("idx_pikku_celery_run_events_run_name", table_name="pikku_celery_run_events")
    op.drop_table("pikku_celery_run_events")
