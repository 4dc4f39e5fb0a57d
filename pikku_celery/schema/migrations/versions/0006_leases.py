"""Leases: one holder at a time for work a whole cluster shares (recovery, the reaper).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pikku_celery_leases",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("taken_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_pikku_celery_leases"),
    )


def downgrade() -> None:
    op.drop_table("pikku_celery_leases")
