"""When a chord's body was sent (``pikku_celery_result_chords.sent_at``): a chord claimed
but never sent (its process killed between COMMIT and publish) is sent again by the reaper.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Frozen copy of the column type as it was at this revision.
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("pikku_celery_result_chords") as batch:
        batch.add_column(sa.Column("sent_at", TS))
    # The reaper looks only at chords fired and not sent: a partial index keeps that
    # look cheap however many chords are kept.
    op.create_index(
        "idx_pikku_celery_result_chords_unsent",
        "pikku_celery_result_chords",
        ["fired_at"],
        postgresql_where=sa.text("sent_at IS NULL"),
        sqlite_where=sa.text("sent_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("idx_pikku_celery_result_chords_unsent", table_name="pikku_celery_result_chords")
    with op.batch_alter_table("pikku_celery_result_chords") as batch:
        batch.drop_column("sent_at")
