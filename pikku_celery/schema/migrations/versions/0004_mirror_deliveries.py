"""The mirror's ledger of counted deliveries, so a batch written twice counts once.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pikku_celery_deliveries",
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name="pk_pikku_celery_deliveries"),
    )
    op.create_index(
        "idx_pikku_celery_deliveries_created", "pikku_celery_deliveries", ["created_at"]
    )


def downgrade() -> None:
    op.drop_index("idx_pikku_celery_deliveries_created", table_name="pikku_celery_deliveries")
    op.drop_table("pikku_celery_deliveries")
