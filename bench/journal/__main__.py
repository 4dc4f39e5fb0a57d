"""What one ``Journal.append`` costs, alone: the segment journal against the SQLite one it
replaced (a copy of that one's storage is kept here, as it was, for the comparison).

Each side appends the same encoded event (a task's start, as the mirror journals it)
``--appends`` times in a fresh folder, in ``--rounds`` alternating rounds; the figure is
the median round's microseconds per append. Encoding the event is not counted: it is the
same for both (and printed on its own).

    python -m bench.journal [--appends 50000] [--rounds 5]
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, Protocol

from bench.harness.options import parser
from pikku_celery.mirror.events import AttemptStarted, encode
from pikku_celery.mirror.journal import Journal

_SQLITE_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS events ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, payload TEXT NOT NULL,"
    " not_before REAL NOT NULL DEFAULT 0, deferred_since REAL)",
)


class SqliteJournal:
    """The storage of the journal before segments: one SQLite file (WAL,
    ``synchronous=NORMAL``), one autocommit INSERT per append under a mutex."""

    def __init__(self, path: Path) -> None:
        self._mutex = threading.Lock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        for statement in _SQLITE_SCHEMA:
            self._db.execute(statement)

    def append(self, kind: str, payload: str) -> None:
        with self._mutex:
            self._db.execute("INSERT INTO events (kind, payload) VALUES (?, ?)", (kind, payload))

    def close(self, *, delete_if_empty: bool = False) -> None:
        self._db.close()


class Appender(Protocol):
    def append(self, kind: str, payload: str) -> None: ...

    def close(self, *, delete_if_empty: bool = ...) -> None: ...


def event() -> tuple[str, str]:
    started = AttemptStarted(
        id="5b0c1f1e-4a8e-4b8e-9d7e-2f0f5a1c9e11-000042",
        at=time.time(),
        step_id="a3f1c2d4-5e6f-4a8b-9c0d-1e2f3a4b5c6d",
        attempt=1,
        worker="celery@worker-7",
        pid=os.getpid(),
    )
    return started.kind, encode(started)


def per_append(make: Callable[[Path], Appender], folder: Path, appends: int) -> float:
    """Microseconds per append into a journal made fresh in ``folder``."""
    journal = make(folder)
    kind, payload = event()
    append = journal.append
    start = time.perf_counter()
    for _ in range(appends):
        append(kind, payload)
    took = time.perf_counter() - start
    journal.close(delete_if_empty=False)
    return took / appends * 1e6


def encode_cost(appends: int) -> float:
    start = time.perf_counter()
    for _ in range(appends):
        event()
    return (time.perf_counter() - start) / appends * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    options = parser(
        "journal",
        __doc__.split("\n\n")[0],
        quick="5,000 appends, 2 rounds",
        rounds=(5, 2, "the median is reported"),
    )
    options.size("--appends", 50_000, 5_000, "appends a round")
    args = options.read(argv)
    sides: dict[str, Callable[[Path], Appender]] = {
        "sqlite (before)": lambda folder: SqliteJournal(folder / "old.journal"),
        "segments (now)": lambda folder: Journal(folder / "new.journal", "bench"),
    }
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, make in sides.items():
            with tempfile.TemporaryDirectory(prefix="pikku-journal-bench-") as tmp:
                figures[name].append(per_append(make, Path(tmp), args.appends))
    kind, payload = event()
    print(f"{args.appends} appends of a {len(payload)}-byte {kind!r} event, {args.rounds} rounds")
    for name, values in figures.items():
        print(
            f"  {name:16} {statistics.median(values):6.2f} µs per append "
            f"(rounds: {', '.join(f'{v:.2f}' for v in values)})"
        )
    print(f"  {'make + encode':16} {encode_cost(args.appends):6.2f} µs per event, not counted")


if __name__ == "__main__":
    main()
