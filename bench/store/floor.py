"""The raw-driver floor: the DBAPI calls the store made, replayed without the store.

The floor's SQL is the store's own, captured with a ``before_cursor_execute``
listener, so the two sides differ only in what the store and SQLAlchemy add.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine.interfaces import ExecuteStyle

from pikku_celery.store import WorkflowStore

__all__ = ["Call", "CapturedBatch", "Floor", "capture_calls"]

# Ids and times inside parameter values, whole or within JSON text (rows sent as
# one JSON document): SQLite's stored text, or ISO 8601 as json.dumps writes it.
_UUID_TEXT: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME_TEXT: Final = re.compile(
    r"(\d{4}-\d{2}-\d{2})([ T])(\d{2}:\d{2}:\d{2}\.\d{6})((?:[+-]\d{2}:\d{2})?)"
)


@dataclass(frozen=True)
class Call:
    """One call the store made on its DBAPI cursor."""

    sql: str
    # executemany: a list of parameter sets; else one (a multi-row VALUES
    # statement from SQLAlchemy's insertmanyvalues is one execute).
    params: Any
    many: bool


def capture_calls(store: WorkflowStore, action: Callable[[], object]) -> list[Call]:
    """The DBAPI calls ``action`` makes the store send, in order."""
    seen: list[Call] = []

    def listener(
        conn: sa.Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        many = executemany and context.execute_style is ExecuteStyle.EXECUTEMANY
        seen.append(Call(statement, parameters, many))

    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        action()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    return seen


class _Refresh:
    """Captured parameters made new: every id a fresh UUID (the same id twice, the
    same new one), every time moved by ``shift``; everything else as captured."""

    def __init__(self, shift: dt.timedelta) -> None:
        self.shift = shift
        self.ids: dict[str, str] = {}

    def _id(self, match: re.Match[str]) -> str:
        fresh = self.ids.get(match[0])
        if fresh is None:
            fresh = self.ids[match[0]] = str(uuid.uuid4())
        return fresh

    def _time(self, match: re.Match[str]) -> str:
        date, sep, clock, zone = match.groups()
        moved = dt.datetime.fromisoformat(f"{date}T{clock}") + self.shift
        return moved.isoformat(sep, "microseconds") + zone

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return _TIME_TEXT.sub(self._time, _UUID_TEXT.sub(self._id, value))
        if isinstance(value, dt.datetime):
            return value + self.shift
        if isinstance(value, list):
            return [self(item) for item in value]
        if isinstance(value, tuple):
            return tuple(self(item) for item in value)
        if isinstance(value, dict):
            return {key: self(item) for key, item in value.items()}
        return value


@dataclass(frozen=True)
class CapturedBatch:
    """One batch's calls, and when their values were made: the floor's template."""

    calls: list[Call]
    made: dt.datetime

    def fresh(self) -> list[Call]:
        """The calls again for new rows (new ids, times moved to now)."""
        refresh = _Refresh(dt.datetime.now(dt.timezone.utc) - self.made)
        return [Call(call.sql, refresh(call.params), call.many) for call in self.calls]


class Floor:
    """Calls replayed on a bare DBAPI connection, one transaction per ``apply``.

    The connection is the store engine's own, taken out of its pool: it
    carries exactly the settings the store's connections carry (SQLite's
    pragmas), and from there on SQLAlchemy is not in the loop.
    ``cursor.executemany`` where the store called it: psycopg 3 runs it in
    pipeline mode, as it does under the store.
    """

    def __init__(self, store: WorkflowStore) -> None:
        self._pooled = store.engine.raw_connection()
        conn = self._pooled.driver_connection
        if conn is None:
            raise RuntimeError("the store's engine gave a connection without a driver connection")
        self._conn: Any = conn
        self._cursor = self._conn.cursor()

    def apply(self, calls: Sequence[Call]) -> None:
        cursor = self._cursor
        for call in calls:
            if call.many:
                cursor.executemany(call.sql, call.params)
            else:
                cursor.execute(call.sql, call.params)
                if cursor.description is not None:
                    cursor.fetchall()
        self._conn.commit()

    def explain(self, prefix: str, call: Call) -> list[tuple[Any, ...]]:
        """The rows of ``prefix`` + the call's SQL, rolled back (``EXPLAIN ANALYZE`` runs it)."""
        params = call.params[0] if call.many else call.params
        try:
            self._cursor.execute(prefix + call.sql, params)
            return [tuple(row) for row in self._cursor.fetchall()]
        finally:
            self._conn.rollback()

    def close(self) -> None:
        self._pooled.close()
