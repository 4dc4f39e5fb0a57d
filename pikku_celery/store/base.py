"""The plumbing every store write and read shares: engine, transactions, errors.

Every write takes an optional connection: given one, it runs there and leaves
committing to the caller; otherwise it commits its own transaction.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from pikku_celery.durations import format_duration
from pikku_celery.errors import (
    InvalidStatus,
    PikkuCeleryError,
    SchemaNotCurrent,
    StoreConflict,
    StoreError,
    StoreUnavailable,
)
from pikku_celery.schema import format_timestamp, migrate
from pikku_celery.store.codec import DEFAULT_MAX_PAYLOAD_BYTES, JsonCodec, error_document
from pikku_celery.store.engine import (
    configure_engine,
    make_engine,
    safe_url,
    sqlite_file,
    sqlite_path_hint,
)
from pikku_celery.store.models import RUN_STATUSES

__all__ = ["UNSET", "ErrorLike", "StoreBase", "new_id", "now", "sqlite_value"]

logger = logging.getLogger(__name__)

ErrorLike = BaseException | Mapping[str, Any] | str


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def sqlite_value(value: Any) -> Any:
    """A parameter as the SQLite column types store it: a time as ISO-8601 UTC text,
    the format ``UtcDateTime`` writes, so compiled statements compare like with like."""
    if isinstance(value, dt.datetime):
        return format_timestamp(value)
    return value


# SQLSTATE class 40: the server rolled the transaction back (deadlock, serialization).
_ROLLED_BACK: Final = "40"


def _is_conflict(orig: BaseException | None) -> bool:
    state = getattr(orig, "sqlstate", None)
    return isinstance(state, str) and state.startswith(_ROLLED_BACK)


def _driver_params(values: dict[str, Any], order: tuple[str, ...] | None) -> Any:
    # SQLite: positional parameters, and time as the text SQLAlchemy stores.
    return values if order is None else tuple(sqlite_value(values[name]) for name in order)


MAX_PAGE: Final = 1000


def check_page(limit: int, offset: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}; page with offset=.")
    if offset < 0:
        raise ValueError("offset must be 0 or more.")


def run_statuses(status: str | Sequence[str] | None) -> list[str]:
    """One status or several, each checked against the run statuses."""
    statuses = [status] if isinstance(status, str) else list(status or [])
    for one in statuses:
        if one not in RUN_STATUSES:
            raise InvalidStatus("run", one, RUN_STATUSES)
    return statuses


def like_prefix(text: str, suffix: str = "%") -> str:
    """A LIKE pattern (escape character ``\\``) matching ``text`` literally, then ``suffix``."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{escaped}{suffix}"


def new_id() -> str:
    return str(uuid.uuid4())


class StoreBase:
    """The engine and the transaction and error handling under ``WorkflowStore``.

    ``WorkflowStore("postgresql://...")``, ``WorkflowStore("sqlite:///pikku.db")``
    or ``WorkflowStore(engine)``. Call :meth:`init` (or ``pikku-celery db
    upgrade``) once to bring the schema up to date.
    """

    def __init__(
        self,
        url_or_engine: str | sa.URL | sa.Engine | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if isinstance(url_or_engine, sa.Engine):
            self._owns_engine = False
            self.engine = configure_engine(url_or_engine)
        else:
            self._owns_engine = True
            self.engine = make_engine(url_or_engine)
        self.dialect: str = self.engine.dialect.name
        self._pg = self.dialect == "postgresql"
        self.codec = JsonCodec(max_bytes=max_payload_bytes, allow_nul=not self._pg)
        self._compiled: dict[sa.Executable, tuple[str, dict[str, Any], tuple[str, ...] | None]] = {}
        # Shares the engine's pool; connections are put back as they were.
        self._autocommit: sa.Engine | None = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT") if self._pg else None
        )

    def __repr__(self) -> str:
        return f"WorkflowStore({safe_url(self.engine.url)!r})"

    # --- lifecycle ---------------------------------------------------------

    def init(self) -> None:
        """Bring the database to the latest schema; does nothing when it is already there."""
        with self._errors():
            migrate.upgrade(self.engine)

    def schema_revision(self) -> str | None:
        """The schema revision the database is at (None: pikku-celery never ran there)."""
        with self._errors():
            return migrate.current_revision(self.engine)

    @staticmethod
    def latest_schema_revision() -> str:
        return migrate.head_revision()

    def close(self) -> None:
        """Release the store's connections (an engine passed in is left to its owner)."""
        if self._owns_engine:
            self.engine.dispose()

    def dispose_after_fork(self) -> None:
        """Forget connections inherited from a parent process without closing them."""
        self.engine.dispose(close=False)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Driver errors become pikku-celery errors, the driver's on ``__cause__``."""
        try:
            yield
        except PikkuCeleryError:
            raise
        except sa_exc.DBAPIError as exc:
            text = str(exc.orig).lower()
            if (
                "no such table" in text
                or "undefinedtable" in type(exc.orig).__name__.lower()
                or ("does not exist" in text and "relation" in text)
                or "no such column" in text
            ):
                raise SchemaNotCurrent(
                    f"The workflow tables at {safe_url(self.engine.url)} are missing or old; "
                    "run `pikku-celery db upgrade` (or WorkflowStore.init())."
                ) from exc
            if _is_conflict(exc.orig):
                raise StoreConflict(
                    "The workflow database rolled a transaction back because it conflicted "
                    f"with another ({type(exc.orig).__name__}); run it again."
                ) from exc
            if self.dialect == "sqlite" and "unable to open database file" in text:
                # Still StoreUnavailable (the flusher keeps the events and retries), but
                # "is it running" means nothing for a file: say which path was tried.
                raise StoreUnavailable(self._unopenable_sqlite()) from exc
            if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError) or (
                exc.connection_invalidated
            ):
                raise StoreUnavailable(
                    f"The workflow database {safe_url(self.engine.url)} cannot be reached "
                    f"({type(exc.orig).__name__}); check that it is running and the URL is right."
                ) from exc
            raise StoreError(
                f"The workflow database refused a statement ({type(exc.orig).__name__}: "
                f"{str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ''})."
            ) from exc

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

    @contextmanager
    def _tx(self, conn: sa.Connection | None) -> Iterator[sa.Connection]:
        with self._errors():
            if conn is not None:
                yield conn
            else:
                with self.engine.begin() as own:
                    yield own

    @contextmanager
    def _single(self, conn: sa.Connection | None) -> Iterator[sa.Connection]:
        """For a write that is one statement: atomic by itself, so on PostgreSQL it runs
        in autocommit, one round trip instead of three (BEGIN, statement, COMMIT)."""
        if conn is None and self._autocommit is not None:
            with self._errors(), self._autocommit.connect() as own:
                yield own
        else:
            with self._tx(conn) as own:
                yield own

    @contextmanager
    def _read(self, conn: sa.Connection | None) -> Iterator[sa.Connection]:
        with self._errors():
            if conn is not None:
                yield conn
            else:
                # A lone read needs no transaction around it either.
                with (self._autocommit or self.engine).connect() as own:
                    yield own

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """A transaction to pass as ``conn=`` so several writes commit together.

        Failing to connect or to commit raises the same typed errors as any
        store call (``StoreUnavailable`` when the database cannot be reached).
        """
        with self._errors(), self.engine.begin() as conn:
            yield conn

    def _run_compiled(
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

    def _run_compiled_many(
        self, conn: sa.Connection, statement: sa.Executable, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        """:meth:`_run_compiled` with many parameter sets: one ``executemany``, which
        psycopg sends in pipeline mode (one round trip)."""
        if not rows:
            return
        sql, constants, order = self._compile(statement)
        conn.exec_driver_sql(sql, [_driver_params({**constants, **row}, order) for row in rows])

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

    def _first_attempt_rows(
        self,
        *,
        step_id: str,
        run_id: str,
        step_name: str,
        rpc_name: str | None,
        data: Any,
        status: str,
        retries: int | None,
        retry_delay: float | str | dt.timedelta | None,
        from_step_name: str | None,
        timestamp: dt.datetime,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The rows of a new step and of its attempt 1, before any status stamp."""
        step = {
            "workflow_step_id": step_id,
            "workflow_run_id": run_id,
            "step_name": step_name,
            "rpc_name": rpc_name,
            "data": self._json(data, f"input of step {step_name!r}"),
            "status": status,
            "retries": retries,
            "retry_delay": None if retry_delay is None else format_duration(retry_delay),
            "from_step_name": from_step_name,
            "current_attempt": 1,
            "created_at": timestamp,
            "updated_at": timestamp,
        }
        attempt = {
            "history_id": new_id(),
            "workflow_step_id": step_id,
            "status": status,
            "attempt": 1,
            "created_at": timestamp,
        }
        return step, attempt

    def _json(self, value: Any, what: str) -> str:
        return self.codec.encode(value, what)

    def _error_json(self, error: ErrorLike) -> str:
        return self.codec.encode(error_document(error), "error")
