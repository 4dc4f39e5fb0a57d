"""Chords the result backend finishes itself, without ``celery.chord_unlock``
(``pikku_celery_result_chords``, ``pikku_celery_result_chord_parts``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# Frozen copy of the column type as it was at this revision.
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "pikku_celery_result_chords",
        sa.Column("group_id", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("fired_at", TS),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("group_id", name="pk_pikku_celery_result_chords"),
    )
    op.create_index(
        "idx_pikku_celery_result_chords_created", "pikku_celery_result_chords", ["created_at"]
    )
    op.create_table(
        "pikku_celery_result_chord_parts",
        sa.Column("group_id", sa.Text, nullable=False),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("group_id", "task_id", name="pk_pikku_celery_result_chord_parts"),
    )
    op.create_index(
        "idx_pikku_celery_result_chord_parts_task", "pikku_celery_result_chord_parts", ["task_id"]
    )


def downgrade() -> None:
    op.drop_index(
        "idx_pikku_celery_result_chord_parts_task", table_name="pikku_celery_result_chord_parts"
    )
    op.drop_table("pikku_celery_result_chord_parts")
    op.drop_index("idx_pikku_celery_result_chords_created", table_name="pikku_celery_result_chords")
    op.drop_table("pikku_celery_result_chords")
