"""A chord's parts say themselves whether they are done
(``pikku_celery_result_chord_parts.done``): a chord is counted by its own rows, on its
group id, with no join to ``pikku_celery_results``, the layout a distributed engine can
shard (results by task id, a chord and its parts by group id).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# Celery's ready states as they were at this revision.
READY = ("SUCCESS", "FAILURE", "REVOKED")


def upgrade() -> None:
    with op.batch_alter_table("pikku_celery_result_chord_parts") as batch:
        batch.add_column(sa.Column("done", sa.Boolean, nullable=False, server_default=sa.false()))
    # The parts whose results are in already: a chord half done before the upgrade is
    # counted as it was, and fires once when its last part's result comes.
    parts = sa.table(
        "pikku_celery_result_chord_parts", sa.column("task_id"), sa.column("done", sa.Boolean)
    )
    results = sa.table("pikku_celery_results", sa.column("task_id"), sa.column("status"))
    op.execute(
        parts.update()
        .where(parts.c.task_id.in_(sa.select(results.c.task_id).where(results.c.status.in_(READY))))
        .values(done=True)
    )
    op.create_index(
        "idx_pikku_celery_result_chord_parts_waiting",
        "pikku_celery_result_chord_parts",
        ["group_id"],
        postgresql_where=sa.text("NOT done"),
        sqlite_where=sa.text("done = 0"),
    )


def downgrade() -> None:
    op.drop_index(
        "idx_pikku_celery_result_chord_parts_waiting",
        table_name="pikku_celery_result_chord_parts",
    )
    with op.batch_alter_table("pikku_celery_result_chord_parts") as batch:
        batch.drop_column("done")
