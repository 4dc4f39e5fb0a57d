"""Waiting for results without polling SQL: told when a result may have come.

A reader of Celery's API (``AsyncResult.get()``) waits on a :class:`ResultWatch`
between two reads of its results instead of sleeping blind:

- **PostgreSQL**: every batch that writes ready results ends with one
  ``pg_notify`` on :data:`CHANNEL` (delivered at COMMIT, so a woken reader
  finds the result). Each process keeps one ``LISTEN`` connection per database,
  on a thread of its own, which wakes the watches of the task ids named (or all
  of them when the payload says ``*``). While that connection is away (a cut,
  a restart, a pooler in transaction mode refusing LISTEN), the watches say they
  cannot push and the reader falls back to polling; after every reconnect each
  watch is woken once, so a result committed meanwhile is read. A listener first
  proves it hears: it sends itself a notification from another connection, and a
  way that passes none on (PgBouncer in transaction mode) leaves readers polling.
- **SQLite**: the watch asks ``PRAGMA data_version`` every few milliseconds on a
  connection of its own; it changes when another connection commits, and only
  then is the result read again.
- **Other wake-ups** (:class:`Wakeups`, the broker's pub/sub for readers that cannot
  LISTEN): told after each COMMIT that wrote ready results, in place of the NOTIFY.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final, Protocol

import sqlalchemy as sa

__all__ = [
    "CHANNEL",
    "PAYLOAD_LIMIT",
    "ResultWatch",
    "Wakeups",
    "listen_for_results",
    "notify_payload",
    "watch_data_version",
]

logger = logging.getLogger(__name__)

#: The channel results are announced on.
CHANNEL: Final = "pikku_celery_results"
#: PostgreSQL refuses payloads of 8,000 bytes or more: above this, "*" (read again, all).
PAYLOAD_LIMIT: Final = 7900
# How often a SQLite watch looks at data_version: cheaper than any read of results.
_SQLITE_LOOK: Final = 0.002
# How long the listener waits before it connects again.
_RECONNECT: Final = 1.0
# A listener's own notification, sent from another connection when it connects: heard
# within this many seconds, or the way to the database cannot carry LISTEN.
_PROBE: Final = "probe:"
_PROBE_WAIT: Final = 2.0
# How long a listener that heard nothing waits before it tries again.
_DEAF_PAUSE: Final = 60.0


def notify_payload(task_ids: Iterable[str]) -> str:
    """The ids a batch wrote, comma-separated, or ``*`` when they would not fit."""
    payload = ",".join(sorted(set(task_ids)))
    return payload if len(payload.encode()) < PAYLOAD_LIMIT else "*"


class ResultWatch:
    """Waits until some of ``task_ids`` may have a new result; :attr:`pushes` says whether
    it is told (a reader that is not told polls)."""

    pushes = False

    def wait(self, timeout: float) -> None:
        time.sleep(max(0.0, timeout))

    def close(self) -> None:
        pass

    def __enter__(self) -> ResultWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Wakeups(Protocol):
    """Another way than the database's own that readers are told of results: announced
    after each COMMIT that wrote ready results, watched by readers between two reads."""

    def announce(self, task_ids: Sequence[str]) -> None:
        """The results of ``task_ids`` are committed (raising is logged, nothing more)."""

    def watch(self, task_ids: Iterable[str]) -> ResultWatch:
        """What a reader of ``task_ids`` waits on."""


class _Told(ResultWatch):
    def __init__(self, listener: _Listener, task_ids: frozenset[str]) -> None:
        self._listener = listener
        self.task_ids = task_ids
        self.event = threading.Event()
        listener.add(self)

    @property
    def pushes(self) -> bool:  # type: ignore[override]
        return self._listener.healthy

    def wait(self, timeout: float) -> None:
        self.event.wait(max(0.0, timeout))
        self.event.clear()

    def close(self) -> None:
        self._listener.remove(self)


class _Listener:
    """This process's LISTEN connection to one PostgreSQL database, on its own thread."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._lock = threading.Lock()
        self._watches: set[_Told] = set()
        self.healthy = False
        self._said_deaf = False
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pikku-celery-listen", daemon=True)
        self._thread.start()

    def add(self, watch: _Told) -> None:
        with self._lock:
            self._watches.add(watch)

    def remove(self, watch: _Told) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _wake(self, task_ids: frozenset[str] | None) -> None:
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            if task_ids is None or not watch.task_ids.isdisjoint(task_ids):
                watch.event.set()

    def _run(self) -> None:
        import psycopg  # the PostgreSQL driver; only a PostgreSQL store gets here

        pause = _RECONNECT
        while True:
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if not self._hears(conn):
                        # A pooler in transaction mode (PgBouncer's) accepts LISTEN and
                        # then hands the server connection to someone else: nothing is
                        # ever heard. Readers poll; look again much later.
                        self._say_deaf()
                        pause = _DEAF_PAUSE
                        continue
                    pause = _RECONNECT
                    self.healthy = True
                    self.connected.set()
                    self._wake(None)  # whatever committed while nobody listened
                    for note in conn.notifies():
                        payload = note.payload
                        self._wake(None if payload == "*" else frozenset(payload.split(",")))
            except Exception as exc:  # a cut, a restart, a pooler that refuses LISTEN
                logger.info(
                    "pikku-celery's result listener lost its connection (%s); waiting readers "
                    "poll until it is back",
                    type(exc).__name__,
                    extra={"action": "result_listener_lost"},
                )
            finally:
                self.healthy = False
                self.connected.clear()
                self._wake(None)
            time.sleep(pause)

    def _hears(self, conn: Any) -> bool:
        """Whether a notification sent from another connection reaches this one."""
        import psycopg

        token = f"{_PROBE}{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
        with psycopg.connect(self._dsn, autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, %s)", (CHANNEL, token))
        deadline = time.monotonic() + _PROBE_WAIT
        while (left := deadline - time.monotonic()) > 0:
            for note in conn.notifies(timeout=left, stop_after=1):
                if note.payload == token:
                    return True
        return False

    def _say_deaf(self) -> None:
        if not self._said_deaf:
            self._said_deaf = True
            logger.warning(
                "pikku-celery's result listener hears no notification through this database "
                "URL (a pooler in transaction mode, such as PgBouncer's, cannot pass LISTEN "
                "on): waiting readers poll instead. Give readers a direct or session-pooled "
                "URL for pushed waits, or set pikku_result_notify = False to say so.",
                extra={"action": "result_listener_deaf"},
            )


class _SqliteWatch(ResultWatch):
    pushes = True

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self._version = self._data_version()

    def _data_version(self) -> int:
        return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout)
        while time.monotonic() < deadline:
            version = self._data_version()
            if version != self._version:
                self._version = version
                return
            time.sleep(min(_SQLITE_LOOK, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        self._db.close()


_LISTENERS: dict[tuple[int, str], _Listener] = {}
_LISTENERS_LOCK = threading.Lock()


def _listener(dsn: str) -> _Listener:
    key = (os.getpid(), dsn)  # a forked child listens on a connection of its own
    with _LISTENERS_LOCK:
        listener = _LISTENERS.get(key)
        if listener is None:
            listener = _LISTENERS[key] = _Listener(dsn)
        return listener


def listen_for_results(engine: sa.Engine, task_ids: Iterable[str]) -> ResultWatch:
    """PostgreSQL: a watch over ``task_ids``, told by this process's LISTEN connection."""
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    return _Told(_listener(dsn), frozenset(task_ids))


def watch_data_version(engine: sa.Engine, task_ids: Iterable[str]) -> ResultWatch:
    """SQLite: a watch on the database file's ``data_version``; one that is never told
    (the reader polls) for a database with no file of its own (in memory)."""
    path = engine.url.database
    if path and path != ":memory:" and not path.startswith("file:"):
        with contextlib.suppress(sqlite3.Error):
            return _SqliteWatch(path)
    return ResultWatch()
