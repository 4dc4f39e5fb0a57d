"""Alembic environment for pikku-celery's own migrations.

Runs only on a connection handed over by ``pikku_celery.schema.migrate``; it keeps its
own version table so it never meets the user's alembic history.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from pikku_celery.schema import metadata

VERSION_TABLE = "pikku_celery_alembic_version"
# Any constant works; it only has to be the same in every process.
_PG_MIGRATION_LOCK = 0x70696B6B75


def _run() -> None:
    connection: sa.Connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Two workers starting at once must not both create the tables.
            connection.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
        context.run_migrations()


_run()
