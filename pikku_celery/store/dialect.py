"""What PostgreSQL and SQLite do differently, in one catalogue per dialect.

The connector holds one, as ``db.sql``, chosen by its engine's dialect when it is
made (:func:`dialect_named`); nothing else in the store asks which database it
talks to. A catalogue carries:

- the dialect's spellings: its INSERT (``postgresql.insert`` or ``sqlite.insert``,
  picked here and nowhere else), its clock, how a key matches a list of ids;
- the statements whose SQL differs between the two, built from those spellings once
  per process: every connector of a dialect shares them, so ``Connector.run`` compiles
  each once per engine;
- what the connector and the operations set themselves up by (``one_writer``, ...);
- where a whole way of working differs, not only a statement, the object that works
  the dialect's way: a batch's writes (``store/batch_writes.py``) and a reader's wait
  for results (``store/result_watch.py``).

Statements that read the same in both dialects stay where they are, in ``store/sql/``;
so do the statements only PostgreSQL can run (``*_pg``), which its catalogue and its
batch writes name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from pikku_celery.errors import StoreError
from pikku_celery.store import sql
from pikku_celery.store.batch_writes import BatchWrites, PostgresWrites, SqliteWrites
from pikku_celery.store.result_watch import ResultWatch, listen_for_results, watch_data_version

if TYPE_CHECKING:
    from pikku_celery.store.connector import Connector

__all__ = ["Dialect", "PostgreSQL", "SQLite", "dialect_named"]


class Dialect(ABC):
    """One dialect's SQL: every statement, fact and way of working that differs."""

    #: The engine's dialect name.
    name: ClassVar[str]
    #: One writer at a time: a write that reads first takes the lock at BEGIN, processes
    #: queue for it, and what a transaction counts is what every other writer committed.
    one_writer: ClassVar[bool]
    #: Each statement is a round trip to a server: a lone statement runs in autocommit,
    #: one trip instead of three (BEGIN, the statement, COMMIT).
    networked: ClassVar[bool]
    #: Its tables may be distributed over servers by key (Citus): a batch then commits in
    #: one transaction per group of keys (``store/shards.py``).
    distributable: ClassVar[bool]
    #: JSON text may hold ``\u0000``.
    json_allows_nul: ClassVar[bool]
    #: Now, in seconds since the epoch, as leases are kept.
    clock: ClassVar[sa.ColumnElement[Any]]
    #: Tells the readers waiting for these results at COMMIT (``channel``, ``payload``);
    #: None where readers watch the database instead.
    notify_ready: ClassVar[sa.Executable | None]
    #: Marks a chord's parts done and locks its row (``chord_id``, ``task_ids``), one
    #: statement; None where the two are sent apart (``sql.results``).
    mark_and_lock_chord: ClassVar[sa.Executable | None]
    #: Sets one key of a run's state, whatever characters it holds.
    update_run_state: ClassVar[sa.Update]
    #: Where a streaming replica's replay is (``sql.replica.lag``); None where a database
    #: has no replicas.
    replica_lag: ClassVar[sa.Executable | None]

    def __init__(self) -> None:
        insert = self.insert
        self.claim_step: Final = sql.claims.claim_step(insert)
        self.upsert_workflow_version: Final = sql.versions.upsert_workflow_version(insert)
        self.insert_run_if_absent: Final = sql.workflows.insert_run_if_absent(insert)
        self.open_chord: Final = sql.batches.open_chord(insert, self._typed)
        self.take_lease: Final = sql.leases.take(insert, self.clock)
        self.renew_lease: Final = sql.leases.renew(self.clock)
        self.release_lease: Final = sql.leases.release(self.clock)
        self.lease_clock: Final = sql.leases.now(self.clock)
        self.write_result: Final = sql.results.write_result(insert)
        self.save_group: Final = sql.results.save_group(insert)
        self.insert_chord: Final = sql.results.insert_chord(insert)
        self.insert_chord_parts: Final = sql.results.insert_chord_parts(insert)
        self.add_chord_part: Final = sql.results.add_chord_part(insert)
        self.expire_results: Final = sql.results.expire_results(self.among)
        self.expire_groups: Final = sql.results.expire_groups(self.among)

    @staticmethod
    @abstractmethod
    def insert(table: sa.Table) -> Any:
        """The dialect's INSERT, the one with ON CONFLICT."""

    @staticmethod
    @abstractmethod
    def among(key: sa.ColumnElement[Any], ids: sa.ScalarSelect[Any]) -> sa.ColumnElement[bool]:
        """``key`` is one of the ids the subquery selects."""

    @staticmethod
    @abstractmethod
    def _typed(name: str, type_: Any) -> sa.ColumnElement[Any]:
        """A parameter of a given type inside INSERT ... SELECT, the dialect's way."""

    @abstractmethod
    def record_attempt(self, status: str) -> tuple[sa.Executable, ...]:
        """An event's attempt row and step row (``sql.attempts``), sent in this order with
        the same parameters (``run_id`` among them): one statement where a lone write runs
        in autocommit."""

    @abstractmethod
    def next_attempt(self, status: str) -> tuple[sa.Executable, ...]:
        """The step moved to attempt n+1 and that attempt's row added, sent in this order
        with the same parameters; the last returns the step's row."""

    @abstractmethod
    def batch_writes(self, db: Connector) -> BatchWrites:
        """How this dialect sends each kind of a batch's statements."""

    @staticmethod
    @abstractmethod
    def watch_results(engine: sa.Engine, task_ids: Iterable[str]) -> ResultWatch:
        """What a reader of ``task_ids``' results waits on between two reads."""


class PostgreSQL(Dialect):
    name = "postgresql"
    # Row locks: writers go in at once.
    one_writer = False
    networked = True
    distributable = True
    # jsonb refuses it.
    json_allows_nul = False
    # The server's clock: one clock for every machine of the cluster. When the statement
    # began, not the transaction: one instant however often a statement reads it (a
    # lease's taken_at and expires_at agree), and never older than the statement.
    clock = sa.extract("epoch", sa.func.statement_timestamp())
    notify_ready = sql.results.notify
    mark_and_lock_chord = sql.results.mark_and_lock_chord_pg
    update_run_state = sql.runs.update_run_state_pg
    replica_lag = sql.replica.lag

    @staticmethod
    def insert(table: sa.Table) -> Any:
        return postgresql.insert(table)

    @staticmethod
    def among(key: sa.ColumnElement[Any], ids: sa.ScalarSelect[Any]) -> sa.ColumnElement[bool]:
        # The ids gathered into an array first: as ``IN (subquery)`` the planner hash-joins
        # the subquery against a scan of the whole table, so a batch costs as much as the
        # table is large; ``= ANY(ARRAY(...))`` looks each id up in the key's index instead.
        return key == sa.any_(sa.func.array(ids))

    @staticmethod
    def _typed(name: str, type_: Any) -> sa.ColumnElement[Any]:
        # In INSERT ... SELECT, PostgreSQL needs each parameter's type spelled out.
        return sa.cast(sa.bindparam(name), type_)

    def record_attempt(self, status: str) -> tuple[sa.Executable, ...]:
        # The step row's update rides along in the same statement: one round trip.
        return (sql.attempts.record_attempt_pg(status),)

    def next_attempt(self, status: str) -> tuple[sa.Executable, ...]:
        return (sql.attempts.retry_attempt_pg(status),)

    def batch_writes(self, db: Connector) -> BatchWrites:
        return PostgresWrites(db)

    watch_results = staticmethod(listen_for_results)


class SQLite(Dialect):
    name = "sqlite"
    one_writer = True
    networked = False
    distributable = False
    json_allows_nul = True
    # The caller's clock: the database is on one machine.
    clock = sa.bindparam("now", type_=sa.Float())
    notify_ready = None
    mark_and_lock_chord = None
    update_run_state = sql.runs.update_run_state_sqlite
    replica_lag = None

    def __init__(self) -> None:
        super().__init__()
        # What its batch writes send, one executemany each (PostgreSQL's are set-based).
        self.insert_run_once: Final = sql.attempts.insert_run_once(self.insert)
        self.schedule_step: Final = sql.attempts.schedule_step(self.insert, self._typed)
        self.schedule_attempt: Final = sql.attempts.schedule_attempt(self.insert)
        self.count_deliveries: Final = sql.batches.count_deliveries(self.insert)

    @staticmethod
    def insert(table: sa.Table) -> Any:
        return sqlite.insert(table)

    @staticmethod
    def among(key: sa.ColumnElement[Any], ids: sa.ScalarSelect[Any]) -> sa.ColumnElement[bool]:
        return key.in_(ids)

    @staticmethod
    def _typed(name: str, type_: Any) -> sa.ColumnElement[Any]:
        # A parameter that carries its type, not a CAST: SQLite's CAST would turn a
        # timestamp into a number.
        return sa.bindparam(name, type_=type_)

    def record_attempt(self, status: str) -> tuple[sa.Executable, ...]:
        return (
            sql.attempts.record_attempt_step(status),
            sql.attempts.record_attempt(self.insert, self._typed, status),
        )

    def record_attempts(self, status: str) -> tuple[sa.Executable, ...]:
        """:meth:`record_attempt` for a batch's rows, which carry their run's day: the
        attempt row as VALUES, with no read of its step."""
        return (
            sql.attempts.record_attempt_step(status),
            sql.attempts.record_attempt_rows(self.insert, status),
        )

    def next_attempt(self, status: str) -> tuple[sa.Executable, ...]:
        return (sql.attempts.add_next_attempt(status), sql.attempts.retry_attempt_sqlite(status))

    def batch_writes(self, db: Connector) -> BatchWrites:
        return SqliteWrites(db, self)

    watch_results = staticmethod(watch_data_version)


_DIALECTS: Final[dict[str, type[Dialect]]] = {d.name: d for d in (PostgreSQL, SQLite)}


@cache
def dialect_named(name: str) -> Dialect:
    """The catalogue of the dialect ``name``, built once per process."""
    try:
        kind = _DIALECTS[name]
    except KeyError:
        raise StoreError(
            f"pikku-celery stores runs in PostgreSQL or SQLite, not {name!r}; give a "
            "postgresql:// or sqlite:/// URL."
        ) from None
    return kind()
