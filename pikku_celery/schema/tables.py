"""The SQL structure of the mirror: the only place tables and indexes are declared.

The four tables and their column names are those of the Pikku workflow
engine's SQL store, so its tools can read what pikku-celery writes; the forms
of the values are the data contract (``docs/data-contract.md``). The schema
is brought to a database only by the migrations shipped in
``pikku_celery/schema/migrations`` (run by ``migrate``); a test proves the two agree.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from pikku_celery.errors import UnreadableValue

__all__ = [
    "COMPAT_SCHEMA",
    "OPEN_STEP_CONDITION",
    "TIMESTAMP_FORMAT",
    "Flag",
    "JsonText",
    "UtcDateTime",
    "celery_groups",
    "celery_result_chord_parts",
    "celery_result_chords",
    "celery_results",
    "chords",
    "format_timestamp",
    "leases",
    "metadata",
    "mirror_deliveries",
    "parse_timestamp",
    "read_flag",
    "run_events",
    "sqlite_flag",
    "workflow_runs",
    "workflow_step",
    "workflow_step_history",
    "workflow_versions",
]


class JsonText(sa.types.TypeDecorator[Any]):
    """A JSON document: ``jsonb`` on PostgreSQL, text on SQLite.

    Values are bound as JSON text the store has already encoded (strictly,
    once), so the driver never serialises a second time; PostgreSQL casts the
    text to ``jsonb``. Reading gives Python values on both databases, decoded
    once: text another writer left that is not JSON (Pikku's SQLite plugin
    stores a bare string as it is) is given back as that text.
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
        return _loads_or_text


def _loads_or_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # NULL, or a number SQLite kept as one
    try:
        return json.loads(value)
    except ValueError:
        return value


# --- time: ISO-8601 in UTC, with its zone -----------------------------------------

#: How a point in time is written on SQLite: ISO-8601 UTC with microseconds and
#: ``Z``. Fixed width, so text order is time order; Pikku's reader takes it as a Date.
TIMESTAMP_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"

_TIMESTAMP: Final = re.compile(
    r"\s*(\d{4})-(\d{2})-(\d{2})"
    r"(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?)?"
    r"\s*(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<oh>\d{2})(?::?(?P<om>\d{2}))?)?\s*"
)


def format_timestamp(value: dt.datetime) -> str:
    """The stored text of an aware datetime on SQLite."""
    if value.tzinfo is None:
        raise ValueError("naive datetimes are ambiguous; pass an aware (UTC) datetime")
    return value.astimezone(dt.timezone.utc).strftime(TIMESTAMP_FORMAT)


def parse_timestamp(text: str) -> dt.datetime:
    """A stored time as an aware UTC datetime, from any ISO-8601 form either system writes.

    ``2026-12-01T07:09:14.822425Z`` (pikku-celery), ``2026-12-01T07:09:14.822Z``
    (Pikku), an offset (``+02:00``), or no zone at all (``2026-12-01 07:09:14``,
    SQLite's ``CURRENT_TIMESTAMP`` and pikku-celery before revision 0005): UTC.
    """
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        raise UnreadableValue("timestamp", text, "ISO-8601 UTC, 2026-12-01T07:09:14.822425Z")
    year, month, day, hour, minute, second, fraction = match.groups()[:7]
    zone = dt.timezone.utc
    if match.group("sign"):
        offset = dt.timedelta(hours=int(match.group("oh")), minutes=int(match.group("om") or 0))
        zone = dt.timezone(-offset if match.group("sign") == "-" else offset)
    try:
        value = dt.datetime(
            int(year),
            int(month),
            int(day),
            int(hour or 0),
            int(minute or 0),
            int(second or 0),
            int((fraction or "0")[:6].ljust(6, "0")),
            tzinfo=zone,
        )
    except ValueError as exc:
        raise UnreadableValue("timestamp", text, "a real date and time") from exc
    return value.astimezone(dt.timezone.utc)


def _sqlite_time(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return _utc(value)
    return parse_timestamp(str(value))


def _utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


class UtcDateTime(sa.types.TypeDecorator[dt.datetime]):
    """A point in time, always given back as an aware UTC datetime.

    PostgreSQL keeps ``timestamptz``. SQLite has no time type: there the time
    is text, ISO-8601 UTC with its zone (:data:`TIMESTAMP_FORMAT`), and any
    ISO form another writer left is read too (:func:`parse_timestamp`).
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        if dialect.name == "sqlite":
            return _sqlite_bind_time
        return super().bind_processor(dialect)

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any] | None:
        if dialect.name == "sqlite":
            return _sqlite_time
        return super().result_processor(dialect, coltype)

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are ambiguous; pass an aware (UTC) datetime")
        return value.astimezone(dt.timezone.utc)

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        return None if value is None else _utc(value)


def _sqlite_bind_time(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return format_timestamp(value)
    # Already text: a time compared with a stored one is compared as written.
    return str(value)


# --- booleans -------------------------------------------------------------------

_TRUE_TEXT: Final = frozenset({"true", "t", "1", "yes", "y", "on"})


def read_flag(value: Any) -> bool | None:
    """A boolean in any form either system writes: ``true``/``false`` (PostgreSQL),
    ``'true'``/``'false'`` text (Pikku on SQLite), ``1``/``0`` (pikku-celery before 0005)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip().lower() in _TRUE_TEXT


class Flag(sa.types.TypeDecorator[bool]):
    """A boolean: ``boolean`` on PostgreSQL; on SQLite the text ``'true'``/``'false'``,
    as Pikku writes it. Read in any form either system writes (:func:`read_flag`)."""

    impl = sa.Boolean
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        if dialect.name == "sqlite":
            return sqlite_flag
        return super().bind_processor(dialect)

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any] | None:
        return read_flag


def sqlite_flag(value: Any) -> str | None:
    """The stored text of a boolean on SQLite."""
    return None if value is None else ("true" if value else "false")


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

#: PostgreSQL only (revision 0005): read-only views of the four workflow tables
#: under their own names, JSON columns as text, for Pikku's services. The views
#: name their columns, so PostgreSQL refuses to drop or retype a column they
#: show: a revision that changes one of those columns drops the views first and
#: makes them again after (a test checks that they show every column, as now).
COMPAT_SCHEMA = "pikku_compat"

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
    sa.Column("inline", Flag, nullable=False, server_default=sa.false()),
    sa.Column("graph_hash", sa.Text),
    sa.Column("deterministic", Flag, nullable=False, server_default=sa.false()),
    sa.Column("planned_steps", JsonText),
    sa.Column("wire", JsonText),
    sa.Column("created_at", UtcDateTime, nullable=False, server_default=_now),
    sa.Column("updated_at", UtcDateTime, nullable=False, server_default=_now),
    # Added by revision 0016: the day (UTC) the run was made, copied to every row of it;
    # the partitioned layout range-partitions by it (``schema/partitions.py``).
    sa.Column("run_day", sa.Date),
    sa.Index("idx_workflow_runs_status_created", "status", "created_at"),
    sa.Index("idx_workflow_runs_workflow_created", "workflow", "created_at"),
)

workflow_step = sa.Table(
    "workflow_step",
    metadata,
    # Revision 0013 keys a step by its run first (``(workflow_run_id, workflow_step_id)``),
    # so every row of a run can live on one shard of a distributed database (Citus
    # distributes by the run id). A step id is a Celery task id, unique by making;
    # no constraint holds it unique across runs, as a distributed table could not keep
    # one that leaves out the run: ``idx_workflow_step_id`` finds a step by id alone.
    sa.Column("workflow_step_id", sa.Text, nullable=False),
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
    # Added by revision 0008: where the step's message was first sent (``exchange``,
    # ``routing_key``), so a message sent again goes where the first one went.
    sa.Column("routing", JsonText),
    sa.Column("created_at", UtcDateTime, nullable=False, server_default=_now),
    sa.Column("updated_at", UtcDateTime, nullable=False, server_default=_now),
    sa.Column("run_day", sa.Date),  # revision 0016: its run's day
    sa.PrimaryKeyConstraint("workflow_run_id", "workflow_step_id", name="pk_workflow_step"),
    sa.UniqueConstraint("workflow_run_id", "step_name", name="workflow_step_run_name_unique"),
    sa.Index("idx_workflow_step_run_status", "workflow_run_id", "status"),
    sa.Index("idx_workflow_step_id", "workflow_step_id"),
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
    sa.Column("history_id", sa.Text, nullable=False),
    sa.Column("workflow_step_id", sa.Text, nullable=False),
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
    # Added by revision 0008: the task that took over this attempt's task id when
    # Celery replaced it (``Task.replace``); the attempt ends with that task.
    sa.Column("replaced_by", sa.Text),
    # Added by revision 0013: the attempt's run, first in every key, and the foreign key
    # to its step through it (a step's attempts share its run's shard; deleting the run
    # still deletes them).
    sa.Column("workflow_run_id", sa.Text, nullable=False),
    sa.Column("run_day", sa.Date),  # revision 0016: its run's day
    sa.PrimaryKeyConstraint("workflow_run_id", "history_id", name="pk_workflow_step_history"),
    sa.ForeignKeyConstraint(
        ["workflow_run_id", "workflow_step_id"],
        ["workflow_step.workflow_run_id", "workflow_step.workflow_step_id"],
        name="fk_workflow_step_history_step",
        ondelete="CASCADE",
    ),
    # The key every read of a step's attempts goes by (revision 0015 dropped the index
    # that only repeated its leading columns).
    sa.UniqueConstraint(
        "workflow_run_id",
        "workflow_step_id",
        "attempt",
        name="workflow_step_history_step_attempt_unique",
    ),
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
    sa.Column("event_id", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    # Added by revision 0013: the run of the step delivered, first in the key (rows of
    # before it, whose run nothing told, carry ``''``). No foreign key: the ledger is
    # forgotten by age, and a delivery is counted in the statement that writes its step.
    sa.Column("workflow_run_id", sa.Text, nullable=False),
    sa.Column("run_day", sa.Date),  # revision 0016: its run's day
    sa.PrimaryKeyConstraint("workflow_run_id", "event_id", name="pk_pikku_celery_deliveries"),
    sa.Index("idx_pikku_celery_deliveries_created", "created_at"),
)

# Not one of Pikku's tables either: who holds work that one process of the
# cluster does at a time (recovery at start, a reaper pass). ``generation``
# counts every take (a holder renews and releases only its own); ``taken_at``
# tells a waiter whether a pass began after it started. Times are seconds since
# the epoch, on the database server's clock where there is one. A handful of rows,
# never joined to another table: on a distributed engine it stays a local table of
# the coordinator (or a reference table), outside the distributed set.
leases = sa.Table(
    "pikku_celery_leases",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("generation", sa.Integer, nullable=False),
    sa.Column("taken_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)

# Not one of Pikku's tables: events sent to a run (``pikku.send``). An event is
# kept until a ``ctx.wait_for`` of its name takes it (``taken_by_step_id``), so
# one sent before the workflow reaches its wait is not lost, and each event is
# taken by exactly one wait.
run_events = sa.Table(
    "pikku_celery_run_events",
    metadata,
    # Keyed by its run first since revision 0013.
    sa.Column("event_id", sa.Text, nullable=False),
    sa.Column(
        "workflow_run_id",
        sa.Text,
        sa.ForeignKey("workflow_runs.workflow_run_id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("data", JsonText),
    sa.Column("sent_at", UtcDateTime, nullable=False),
    sa.Column("taken_by_step_id", sa.Text),
    sa.Column("taken_at", UtcDateTime),
    sa.Column("run_day", sa.Date),  # revision 0016: its run's day
    sa.PrimaryKeyConstraint("workflow_run_id", "event_id", name="pk_pikku_celery_run_events"),
    sa.Index("idx_pikku_celery_run_events_run_name", "workflow_run_id", "name", "sent_at"),
)

# Not one of Pikku's tables: the chords of a run whose body is not out yet. A chord's
# header tasks are published with its body's task id; the run cannot complete until a
# step of that id exists (Celery publishes the body when the header is done, from the
# last header task or a ``chord_unlock``), so a run whose header steps have all
# succeeded is not taken for done in between.
chords = sa.Table(
    "pikku_celery_chords",
    metadata,
    sa.Column("body_id", sa.Text, nullable=False),
    sa.Column(
        "workflow_run_id",
        sa.Text,
        sa.ForeignKey("workflow_runs.workflow_run_id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("created_at", UtcDateTime, nullable=False),
    # Added by revision 0013: the body's step is written (set when it is), so whether a
    # run may complete is read from the run's own rows, never from another run's steps.
    sa.Column("body_written", Flag, nullable=False, server_default=sa.false()),
    sa.Column("run_day", sa.Date),  # revision 0016: its run's day
    # Keyed by its run first since revision 0013 (the key serves the run's lookups).
    sa.PrimaryKeyConstraint("workflow_run_id", "body_id", name="pk_pikku_celery_chords"),
    sa.Index("idx_pikku_celery_chords_body", "body_id"),
)

# Not one of Pikku's tables: Celery's own view of each task, for ``backend="pikku://"``.
# ``meta`` is what any Celery result backend keeps for a task (status, result,
# traceback, children, date done, the extended fields), encoded by the app's result
# serializer; ``attempt`` is the attempt that wrote it (``retries + 1``), so a write
# of attempt K replaces anything of an earlier attempt and, within an attempt, a ready
# state is final. The history stays in ``workflow_step_history``.
celery_results = sa.Table(
    "pikku_celery_results",
    metadata,
    sa.Column("task_id", sa.Text, primary_key=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("meta", sa.LargeBinary, nullable=False),
    sa.Column("date_done", UtcDateTime),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Index("idx_pikku_celery_results_updated", "updated_at"),
)

# A group's result as Celery saves it (``GroupResult.save``): its children's ids.
celery_groups = sa.Table(
    "pikku_celery_groups",
    metadata,
    sa.Column("group_id", sa.Text, primary_key=True),
    sa.Column("meta", sa.LargeBinary, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Index("idx_pikku_celery_groups_updated", "updated_at"),
)

# A chord the result backend finishes itself (no ``celery.chord_unlock``): its body as
# the app's result serializer encoded it, how many parts it was given (its rows of parts,
# header and added, are what it waits for: a task may be added before it lands), and when
# the batch that wrote the last of their results claimed its firing (once), and when the
# process that claimed it had sent the body (a chord fired and not sent is sent again).
celery_result_chords = sa.Table(
    "pikku_celery_result_chords",
    metadata,
    sa.Column("group_id", sa.Text, primary_key=True),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("fired_at", UtcDateTime),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("sent_at", UtcDateTime),
    sa.Index("idx_pikku_celery_result_chords_created", "created_at"),
    sa.Index(
        "idx_pikku_celery_result_chords_unsent",
        "fired_at",
        postgresql_where=sa.text("sent_at IS NULL"),
        sqlite_where=sa.text("sent_at IS NULL"),
    ),
)

# The header parts of such a chord, in the order the body gets their results. ``done``:
# the part's task has a ready result, set in the transaction that writes that result, or
# that writes the part when its result came first; so a chord's count is a read of its
# own rows (one key, its group id), never a join to the results (keyed by task id).
celery_result_chord_parts = sa.Table(
    "pikku_celery_result_chord_parts",
    metadata,
    sa.Column("group_id", sa.Text, primary_key=True),
    sa.Column("task_id", sa.Text, primary_key=True),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("done", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Index("idx_pikku_celery_result_chord_parts_task", "task_id"),
    # The parts a chord still waits for: what its count and the reaper's look read.
    sa.Index(
        "idx_pikku_celery_result_chord_parts_waiting",
        "group_id",
        postgresql_where=sa.text("NOT done"),
        sqlite_where=sa.text("done = 0"),
    ),
)
