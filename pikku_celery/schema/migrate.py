"""Bringing a database to the schema this version of pikku-celery expects.

The migrations ship inside the package; their history is kept in
``pikku_celery_alembic_version`` so it never meets the user's own alembic.
"""

from __future__ import annotations

import threading
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

__all__ = [
    "VERSION_TABLE",
    "current_revision",
    "downgrade",
    "head_revision",
    "is_current",
    "upgrade",
]

VERSION_TABLE = "pikku_celery_alembic_version"
_SCRIPT_LOCATION = str(Path(__file__).with_name("migrations"))
# Alembic keeps its running context in module globals: one migration per process at a time.
_ALEMBIC_LOCK = threading.Lock()


def _config(connection: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", _SCRIPT_LOCATION)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision this version of the package ships."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "the package ships at least one migration"
    return head


def current_revision(engine: sa.Engine) -> str | None:
    """The revision the database is at, or None when pikku-celery never ran there."""
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def is_current(engine: sa.Engine) -> bool:
    return current_revision(engine) == head_revision()


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    """Apply every migration up to ``revision``; a database already there is left as it is."""
    with _ALEMBIC_LOCK, engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            # SQLite runs DDL outside any transaction unless one is opened by
            # hand; take the write lock first so two processes starting
            # together do not both create the tables.
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        command.upgrade(_config(connection), revision)
        connection.commit()


def downgrade(engine: sa.Engine, revision: str) -> None:
    """Undo every migration after ``revision`` (``"base"``: all of them)."""
    with _ALEMBIC_LOCK, engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        command.downgrade(_config(connection), revision)
        connection.commit()
