"""Celery's own view of each task and group, for ``backend="pikku://"``
(``pikku_celery_results``, ``pikku_celery_groups``).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# Frozen copy of the column type as it was at this revision.
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "pikku_celery_results",
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("meta", sa.LargeBinary, nullable=False),
        sa.Column("date_done", TS),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("task_id", name="pk_pikku_celery_results"),
    )
    op.create_index("idx_pikku_celery_results_updated", "pikku_celery_results", ["updated_at"])
    op.create_table(
        "pikku_celery_groups",
        sa.Column("group_id", sa.Text, nullable=False),
        sa.Column("meta", sa.LargeBinary, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("group_id", name="pk_pikku_celery_groups"),
    )
    op.create_index("idx_pikku_celery_groups_updated", "pikku_celery_groups", ["updated_at"])


def downgrade() -> None:
    op.drop_index("idx_pikku_celery_groups_updated", table_name="pikku_celery_groups")
    op.drop_table("pikku_celery_groups")
    op.drop_index("idx_pikku_celery_results_updated", table_name="pikku_celery_results")
    op.drop_table("pikku_celery_results")
