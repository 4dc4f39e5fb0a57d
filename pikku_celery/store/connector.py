"""The one connector: the engine, its dialect, transactions, compiled statements, the codec.

Every store operation is handed this object and nothing else holds an engine.
The dialect is decided here, once, when the connector is made: ``sql`` is its
catalogue (``store/dialect.py``), where the operations take what differs
between PostgreSQL and SQLite; none of them tests the dialect.

Every write takes an optional connection: given one, it runs there and leaves
committing to the caller; otherwise it commits its own transaction.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from pikku_celery.errors import (
    PikkuCeleryError,
    SchemaNotCurrent,
    StoreConflict,
    StoreError,
    StoreUnavailable,
)
from pikku_celery.schema import migrate
from pikku_celery.store.batch_pieces import KeyGroups
from pikku_celery.store.codec import DEFAULT_MAX_PAYLOAD_BYTES, JsonCodec, error_document
from pikku_celery.store.common import ErrorLike, sqlite_value
from pikku_celery.store.dialect import Dialect, dialect_named
from pikku_celery.store.engine import (
    configure_engine,
    make_engine,
    safe_url,
    sqlite_file,
    sqlite_path_hint,
)
from pikku_celery.store.shards import CitusShards, DistributedLayout

__all__ = ["Connector"]

# SQLSTATE class 40: the server rolled the transaction back (deadlock, serialization).
_ROLLED_BACK: Final = "40"
# SQLite: take the write lock when the transaction begins, not at its first write, so a
# transaction that reads before it writes cannot be refused the lock halfway.
_SQLITE_BEGIN_WRITE: Final = "BEGIN IMMEDIATE"


def _is_conflict(orig: BaseException | None) -> bool:
    state = getattr(orig, "sqlstate", None)
    return isinstance(state, str) and state.startswith(_ROLLED_BACK)


def _driver_params(values: dict[str, Any], order: tuple[str, ...] | None) -> Any:
    # SQLite: positional parameters, and time as the text SQLAlchemy stores.
    return values if order is None else tuple(sqlite_value(values[name]) for name in order)


class Connector:
    """One database: its engine, dialect, codec and the ways to talk to it."""

    def __init__(
        self,
        url_or_engine: str | sa.URL | sa.Engine | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if isinstance(url_or_engine, sa.Engine):
            self.owns_engine = False
            self.engine = configure_engine(url_or_engine)
        else:
            self.owns_engine = True
            self.engine = make_engine(url_or_engine)
        self.sql: Final[Dialect] = dialect_named(self.engine.dialect.name)
        self.codec = JsonCodec(max_bytes=max_payload_bytes, allow_nul=self.sql.json_allows_nul)
        self._compiled: dict[sa.Executable, tuple[str, dict[str, Any], tuple[str, ...] | None]] = {}
        # Shares the engine's pool; connections are put back as they were. A database with
        # no round trips to save reads and writes single statements in transactions.
        self._autocommit: sa.Engine | None = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.sql.networked
            else None
        )
        path = self.engine.url.database if self.sql.one_writer else None
        self._writers_lock = (
            f"{path}-pikku-writers"
            if path and path != ":memory:" and not path.startswith("file:")
            else None
        )
        self._locked_write: Callable[[], AbstractContextManager[sa.Connection]] = (
            self._begin_immediate if self.sql.one_writer else self._begin
        )
        self.layout = DistributedLayout(self.engine, distributable=self.sql.distributable)
        self._shards = CitusShards(self)
        self._groups: KeyGroups | None = None

    @property
    def key_groups(self) -> KeyGroups | None:
        """How a batch is cut into pieces, one transaction per group of keys: by shard where
        the tables are distributed (Citus), else not at all (None)."""
        if self._groups is not None:
            return self._groups
        return self._shards if self.layout.distributed else None

    def split_batches_by(self, groups: KeyGroups | None) -> None:
        """Cut every batch by ``groups`` from now on (None: as the layout says)."""
        self._groups = groups

    def __repr__(self) -> str:
        return f"Connector({safe_url(self.engine.url)!r})"

    # --- lifecycle ---------------------------------------------------------

    def upgrade(self) -> None:
        with self.errors():
            migrate.upgrade(self.engine)

    def schema_revision(self) -> str | None:
        with self.errors():
            return migrate.current_revision(self.engine)

    def close(self) -> None:
        """Release the connections (an engine passed in is left to its owner)."""
        if self.owns_engine:
            self.engine.dispose()

    def dispose_after_fork(self) -> None:
        """Forget connections inherited from a parent process without closing them."""
        self.engine.dispose(close=False)

    # --- errors ------------------------------------------------------------

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Driver errors become pikku-celery errors, the driver's on ``__cause__``."""
        try:
            yield
        except PikkuCeleryError:
            raise
        except sa_exc.DBAPIError as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: sa_exc.DBAPIError) -> StoreError:
        text = str(exc.orig).lower()
        if (
            "no such table" in text
            or "undefinedtable" in type(exc.orig).__name__.lower()
            or ("does not exist" in text and "relation" in text)
            or "no such column" in text
        ):
            return SchemaNotCurrent(
                f"The workflow tables at {safe_url(self.engine.url)} are missing or old; "
                "run `pikku-celery db upgrade` (or WorkflowStore.init())."
            )
        if _is_conflict(exc.orig):
            return StoreConflict(
                "The workflow database rolled a transaction back because it conflicted "
                f"with another ({type(exc.orig).__name__}); run it again."
            )
        if "unable to open database file" in text and self._autocommit is None:
            # Still StoreUnavailable (the flusher keeps the events and retries), but
            # "is it running" means nothing for a file: say which path was tried.
            return StoreUnavailable(self._unopenable_sqlite())
        if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError) or (
            exc.connection_invalidated
        ):
            return StoreUnavailable(
                f"The workflow database {safe_url(self.engine.url)} cannot be reached "
                f"({type(exc.orig).__name__}); check that it is running and the URL is right."
            )
        first = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
        return StoreError(
            f"The workflow database refused a statement ({type(exc.orig).__name__}: {first})."
        )

    def _unopenable_sqlite(self) -> str:
        where = sqlite_path_hint(self.engine.url)
        path = sqlite_file(self.engine.url)
        if path is not None and not path.parent.is_dir():
            return (
                f"The SQLite database {where} cannot be opened: its folder {path.parent} does "
                "not exist. Create the folder, or give the path of the database your workers "
                "write to."
            )
        return (
            f"The SQLite database {where} cannot be opened; check that the file (or, for a "
            "new one, its folder) exists and that this user may write there."
        )

    # --- connections -------------------------------------------------------

    @contextmanager
    def write(self, conn: sa.Connection | None) -> Iterator[sa.Connection]:
        """A transaction: the caller's, or one of its own committed at the end."""
        with self.errors():
            if conn is not None:
                yield conn
            else:
                with self.engine.begin() as own:
                    yield own

    @contextmanager
    def single(self, conn: sa.Connection | None) -> Iterator[sa.Connection]:
        """For a write that is one statement: atomic by itself, so on PostgreSQL it runs
        in autocommit, one round trip instead of three (BEGIN, statement, COMMIT)."""
        if conn is None and self._autocommit is not None:
            with self.errors(), self._autocommit.connect() as own:
                yield own
        else:
            with self.write(conn) as own:
                yield own

    @contextmanager
    def read(self, conn: sa.Connection | None) -> Iterator[sa.Connection]:
        with self.errors():
            if conn is not None:
                yield conn
            else:
                # A lone read needs no transaction around it either.
                with (self._autocommit or self.engine).connect() as own:
                    yield own

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """A transaction to pass as ``conn=`` so several writes commit together."""
        with self.errors(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def locked_write(self, conn: sa.Connection | None) -> Iterator[sa.Connection]:
        """A transaction of its own (unless given one) that holds the write lock from the
        start: a read-then-delete (pruning) that another writer cannot slip into."""
        if conn is not None:
            yield conn
            return
        with self.errors(), self._locked_write() as own:
            yield own

    @contextmanager
    def _begin(self) -> Iterator[sa.Connection]:
        with self.engine.begin() as own:
            yield own

    @contextmanager
    def _begin_immediate(self) -> Iterator[sa.Connection]:
        with self.engine.connect() as own:
            own.exec_driver_sql(_SQLITE_BEGIN_WRITE)
            yield own
            own.commit()

    def writers_in_turn(self, conn: sa.Connection | None) -> AbstractContextManager[None]:
        """SQLite: batches of several processes take the database's write lock in turn.

        SQLite has one writer at a time, and a writer that finds the lock taken
        sleeps in growing steps (up to 100 ms) before it looks again; an flock on a
        file beside the database queues them instead, each woken the moment the
        one before it commits.
        """
        if conn is not None or self._writers_lock is None:
            return nullcontext()
        return self._flock(self._writers_lock)

    @staticmethod
    @contextmanager
    def _flock(path: str) -> Iterator[None]:
        with open(path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # --- compiled statements -----------------------------------------------

    def run(
        self, conn: sa.Connection, statement: sa.Executable, params: dict[str, Any]
    ) -> sa.CursorResult[Any]:
        """Run a hot-path statement as SQL compiled once for this engine.

        Skips SQLAlchemy's per-call parameter processing, which costs more than
        the round trip itself on a fast network. Only for statements whose
        parameters need no bind processing: ids, numbers, JSON text the codec
        already made, and aware datetimes, which psycopg sends as timestamptz.
        """
        sql, constants, order = self._compile(statement)
        return conn.exec_driver_sql(sql, _driver_params({**constants, **params}, order))

    def run_many(
        self, conn: sa.Connection, statement: sa.Executable, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        """:meth:`run` with many parameter sets: one ``executemany``, which psycopg sends
        in pipeline mode (one round trip)."""
        if not rows:
            return
        sql, constants, order = self._compile(statement)
        conn.exec_driver_sql(sql, [_driver_params({**constants, **row}, order) for row in rows])

    def pipelined(
        self,
        conn: sa.Connection,
        calls: Sequence[tuple[sa.Executable, Mapping[str, Any]]],
        *,
        commit: bool = False,
    ) -> list[list[tuple[Any, ...]]]:
        """PostgreSQL: :meth:`run` for several statements sent together in psycopg's
        pipeline mode, one round trip for all (and the BEGIN of a transaction that has
        not begun); each statement's rows, in order.

        A round trip costs the waiting thread about as much CPU as a statement's Python
        (the wake-up), so a batch's statements that need no answer in between go at once.
        ``commit``: the COMMIT of the transaction of ``conn`` goes with them (SQLAlchemy's
        own COMMIT that follows finds none open, and sends nothing).
        Outside SQLAlchemy's execute: the engine's cursor events are fired here, a driver
        error is wrapped as SQLAlchemy would, and a dropped connection is invalidated, so
        the pool never hands it out again.
        """
        if not calls and not commit:
            return []
        raw: Any = conn.connection.driver_connection
        sent = []
        for statement, params in calls:
            sql, constants, _ = self._compile(statement)
            sent.append((sql, {**constants, **params}))
        cursors = []
        # The engine's listeners see each statement as they see every other one.
        dispatch = conn.dispatch
        try:
            with raw.pipeline():
                for sql, values in sent:
                    cursor = raw.cursor()
                    dispatch.before_cursor_execute(conn, cursor, sql, values, None, False)
                    cursor.execute(sql, values)
                    cursors.append(cursor)
                if commit:
                    raw.commit()
            rows = [cursor.fetchall() if cursor.description else [] for cursor in cursors]
            for cursor, (sql, values) in zip(cursors, sent, strict=True):
                dispatch.after_cursor_execute(conn, cursor, sql, values, None, False)
            return rows
        except conn.dialect.loaded_dbapi.Error as exc:
            dialect = conn.dialect
            lost = dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)
            if lost:
                conn.invalidate(exc)
            raise sa_exc.DBAPIError.instance(
                sent[0][0] if sent else "COMMIT",
                sent[0][1] if sent else {},
                exc,
                dialect.loaded_dbapi.Error,
                connection_invalidated=lost,
                dialect=dialect,
            ) from exc
        finally:
            for cursor in cursors:
                cursor.close()

    def _compile(
        self, statement: sa.Executable
    ) -> tuple[str, dict[str, Any], tuple[str, ...] | None]:
        """The statement's SQL for this engine, its constants, and its parameter order."""
        known = self._compiled.get(statement)
        if known is None:
            compiled = statement.compile(dialect=self.engine.dialect)  # type: ignore[attr-defined]
            # The statement's own constants (a status, '{}') are bound parameters too.
            constants = {
                name: bind.effective_value
                for name, bind in compiled.binds.items()
                if not bind.required
            }
            order = tuple(compiled.positiontup) if compiled.positional else None
            known = self._compiled[statement] = (compiled.string, constants, order)
        return known

    # --- values ------------------------------------------------------------

    def json(self, value: Any, what: str) -> str:
        return self.codec.encode(value, what)

    def error_json(self, error: ErrorLike) -> str:
        return self.codec.encode(error_document(error), "error")
