"""The SQL structure of the mirror: the only place tables and indexes are declared.

The four tables and their column names are those of the Pikku workflow
engine's SQL store, so its tools can read what pikku-celery writes. The schema
is brought to a database only by the migrations shipped in
``pikku_celery/migrations``; a test proves the two agree.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

__all__ = [
    "OPEN_STEP_CONDITION",
    "JsonText",
    "UtcDateTime",
    "leases",
    "metadata",
    "mirror_deliveries",
    "workflow_runs",
    "workflow_step",
    "workflow_step_history",
    "workflow_versions",
]


class JsonText(sa.types.TypeDecorator[Any]):
    """A JSON document: ``jsonb`` on PostgreSQL, text on SQLite.

    Values are bound as JSON text the store has already encoded (strictly,
    once), so the driver never serialises a second time; PostgreSQL casts the
    text to ``jsonb``. Reading gives Python values on both databases.
    """

    impl = sa.Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.JSONB())
        return dialect.type_descriptor(sa.Text())

    def bind_processor(self, dialect: Dialect) -> None:
        return None

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any] | None:
        if dialect.name == "postgresql":
            return None  # psycopg decodes jsonb itself
        return _loads_or_none


def _loads_or_none(value: str | None) -> Any:
    return None if value is None else json.loads(value)


class UtcDateTime(sa.types.TypeDecorator[dt.datetime]):
    """A point in time, always given back as an aware UTC datetime.

    PostgreSQL keeps ``timestamptz``; SQLite has no time zones, so naive UTC is
    stored there and the zone is put back on the way out.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are ambiguous; pass an aware (UTC) datetime")
        value = value.astimezone(dt.timezone.utc)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_now = sa.func.current_timestamp()

#: The steps the partial index ``idx_workflow_step_open`` covers.
OPEN_STEP_CONDITION = "status IN ('scheduled', 'running', 'lost')"

workflow_runs = sa.Table(
    "workflow_runs",
    metadata,
    sa.Column("workflow_run_id", sa.Text, primary_key=True),
    sa.Column("workflow", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("input", JsonText, nullable=False),
    sa.Column("output", JsonText),
    sa.Column("error", JsonText),
    sa.Column("state", JsonText, nullable=False, server_default=sa.text("'{}'")),
    sa.Column("inline", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("graph_hash", sa.Text),
    sa.Column("deterministic", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("planned_steps", JsonText),
    sa.Column("wire", JsonText),
    sa.Column("created_at", UtcDateTime, nullable=False, server_default=_now),
    sa.Column("updated_at", UtcDateTime, nullable=False, server_default=_now),
    sa.Index("idx_workflow_runs_status_created", "status", "created_at"),
    sa.Index("idx_workflow_runs_workflow_created", "workflow", "created_at"),
)

workflow_step = sa.Table(
    "workflow_step",
    metadata,
    sa.Column("workflow_step_id", sa.Text, primary_key=True),
    sa.Column(
        "workflow_run_id",
        sa.Text,
        sa.ForeignKey("workflow_runs.workflow_run_id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("step_name", sa.Text, nullable=False),
    sa.Column("rpc_name", sa.Text),
    sa.Column("data", JsonText),
    sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'pending'")),
    sa.Column("result", JsonText),
    sa.Column("error", JsonText),
    sa.Column("child_run_id", sa.Text),
    sa.Column("branch_taken", sa.Text),
    sa.Column("retries", sa.Integer),
    sa.Column("retry_delay", sa.Text),
    sa.Column("from_step_name", sa.Text),
    sa.Column("current_attempt", sa.Integer),
    sa.Column("created_at", UtcDateTime, nullable=False, server_default=_now),
    sa.Column("updated_at", UtcDateTime, nullable=False, server_default=_now),
    sa.UniqueConstraint("workflow_run_id", "step_name", name="workflow_step_run_name_unique"),
    sa.Index("idx_workflow_step_run_status", "workflow_run_id", "status"),
    # Added by revision 0003: the reaper and the stale-message report look only
    # at unfinished steps, a small part of the table; a partial index keeps
    # their scan that size however many finished steps pile up.
    sa.Index(
        "idx_workflow_step_open",
        "status",
        "updated_at",
        postgresql_where=sa.text(OPEN_STEP_CONDITION),
        sqlite_where=sa.text(OPEN_STEP_CONDITION),
    ),
)

workflow_step_history = sa.Table(
    "workflow_step_history",
    metadata,
    sa.Column("history_id", sa.Text, primary_key=True),
    sa.Column(
        "workflow_step_id",
        sa.Text,
        sa.ForeignKey("workflow_step.workflow_step_id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("result", JsonText),
    sa.Column("error", JsonText),
    sa.Column("attempt", sa.Integer),
    sa.Column("created_at", UtcDateTime, nullable=False, server_default=_now),
    sa.Column("running_at", UtcDateTime),
    sa.Column("scheduled_at", UtcDateTime),
    sa.Column("succeeded_at", UtcDateTime),
    sa.Column("failed_at", UtcDateTime),
    # Added by revision 0002: where and how the attempt ran.
    sa.Column("task_id", sa.Text),
    sa.Column("worker", sa.Text),
    sa.Column("pid", sa.Integer),
    # How many times this attempt was delivered to a worker (a redelivery adds one).
    sa.Column("delivery_count", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("eta", UtcDateTime),
    # Why the attempt exists: first, retry, redelivery, resume, rerun.
    sa.Column("reason", sa.Text),
    sa.UniqueConstraint(
        "workflow_step_id", "attempt", name="workflow_step_history_step_attempt_unique"
    ),
    sa.Index("idx_workflow_step_history_step", "workflow_step_id", "created_at"),
)

workflow_versions = sa.Table(
    "workflow_versions",
    metadata,
    sa.Column("workflow_name", sa.Text, nullable=False),
    sa.Column("graph_hash", sa.Text, nullable=False),
    sa.Column("graph", JsonText, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'active'")),
    sa.Column("created_at", UtcDateTime, nullable=False, server_default=_now),
    sa.PrimaryKeyConstraint("workflow_name", "graph_hash", name="workflow_versions_pk"),
    sa.Index("idx_workflow_versions_source_status", "source", "status"),
)

# Not one of Pikku's tables: the mirror's own ledger of the deliveries it has
# counted, by event id, so a batch written twice (a COMMIT whose outcome was
# lost, a journal replayed by another process) counts each delivery once.
mirror_deliveries = sa.Table(
    "pikku_celery_deliveries",
    metadata,
    sa.Column("event_id", sa.Text, primary_key=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("idx_pikku_celery_deliveries_created", "created_at"),
)

# Not one of Pikku's tables either: who holds work that one process of the
# cluster does at a time (recovery at start, a reaper pass). ``generation``
# counts every take, so a waiter can tell a pass that began after it looked
# from the one it waited on. ``expires_at`` is in seconds since the epoch, on
# the database server's clock where there is one.
leases = sa.Table(
    "pikku_celery_leases",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("generation", sa.Integer, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)
