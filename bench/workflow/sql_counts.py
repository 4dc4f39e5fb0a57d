"""SQL statements and transactions counted by the process and store method that sent them.

A SQLAlchemy ``before_cursor_execute`` listener in every process that talks
to the bench database labels each statement with the outermost public
``WorkflowStore`` method on the stack (or the ``Recorder`` method that
opened the transaction) and sums the time spent in it; commits are timed
likewise. Pool children write their running totals to a file after every
task, which the bench process adds up.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from celery import signals
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

import pikku_celery.mirror.recorder
import pikku_celery.store

__all__ = ["Counts", "SqlCounter", "install_worker_counter", "worker_counts"]

_STORE_DIR: Final = str(Path(pikku_celery.store.__file__).resolve().parent)
_MIRROR_FILE: Final = str(Path(pikku_celery.mirror.recorder.__file__).resolve())
# Store methods whose label says which status they wrote (their SQL differs by it).
_BY_STATUS: Final = frozenset({"record_attempt", "claim_step", "move_run"})


def _caller() -> str:
    """What sent a statement or a commit: the outermost public ``WorkflowStore`` method
    on the stack, else the ``Recorder`` method (a transaction the mirror opened)."""
    frame: Any = sys._getframe(2)
    store: str | None = None
    mirror: str | None = None
    while frame is not None:
        code = frame.f_code
        name = code.co_name
        if not name.startswith(("_", "<")):
            if code.co_filename.startswith(_STORE_DIR):
                store = name
                if name in _BY_STATUS:
                    status = frame.f_locals.get("status")
                    store = f"{name}({status})" if isinstance(status, str) else name
            elif code.co_filename == _MIRROR_FILE and name not in ("write", "record"):
                mirror = f"mirror.{name}"
        frame = frame.f_back
    return store or mirror or "other"


@dataclass
class Counts:
    """Statements (``section:store method``), transactions and tasks, summed over processes."""

    statements: Counter[str] = field(default_factory=Counter)
    transactions: Counter[str] = field(default_factory=Counter)
    tasks: Counter[str] = field(default_factory=Counter)
    #: Milliseconds spent waiting in psycopg's execute and commit, keyed like
    #: ``statements`` (a commit as ``section:COMMIT method``).
    sql_ms: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "statements": dict(self.statements),
            "transactions": dict(self.transactions),
            "tasks": dict(self.tasks),
            "sql_ms": self.sql_ms,
        }

    def add(self, other: Counts) -> None:
        self.statements.update(other.statements)
        self.transactions.update(other.transactions)
        self.tasks.update(other.tasks)
        for key, value in other.sql_ms.items():
            self.sql_ms[key] = self.sql_ms.get(key, 0.0) + value

    def minus(self, other: Counts) -> Counts:
        return Counts(
            Counter(_delta(self.statements, other.statements)),
            Counter(_delta(self.transactions, other.transactions)),
            Counter(_delta(self.tasks, other.tasks)),
            {key: value - other.sql_ms.get(key, 0.0) for key, value in self.sql_ms.items()},
        )

    def statements_in(self, *sections: str) -> int:
        return sum(n for key, n in self.statements.items() if key.split(":", 1)[0] in sections)

    def sql_ms_in(self, *sections: str) -> float:
        return sum(ms for key, ms in self.sql_ms.items() if key.split(":", 1)[0] in sections)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        return cls(
            Counter(data.get("statements", {})),
            Counter(data.get("transactions", {})),
            Counter(data.get("tasks", {})),
            dict(data.get("sql_ms", {})),
        )


def _delta(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key)}


class SqlCounter:
    """Counts this process's statements and transactions against the bench database.

    ``section`` says on whose behalf: ``worker`` in the worker's children;
    ``publish``, ``poll`` or ``other`` in the bench process.
    """

    def __init__(self, section: str) -> None:
        self.section = section
        self.counts = Counts()
        self._started = 0.0
        self._label = "other"

    def install(self) -> None:
        # On the Engine class: the store's engine and its autocommit view alike,
        # and the engine a forked child makes after dropping its parent's pool.
        sa.event.listen(sa.Engine, "before_cursor_execute", self._statement)
        sa.event.listen(sa.Engine, "after_cursor_execute", self._statement_done)
        sa.event.listen(sa.Engine, "commit", self._commit)
        # SQLAlchemy has no event after a commit: time the dialect's own call.
        commit: Callable[[Any, Any], None] = PGDialect_psycopg.do_commit

        def timed_commit(dialect: Any, dbapi_connection: Any) -> None:
            label = f"COMMIT {_caller()}"
            started = time.perf_counter()
            try:
                commit(dialect, dbapi_connection)
            finally:
                self._add_sql_time(label, started)

        PGDialect_psycopg.do_commit = timed_commit  # type: ignore[method-assign]

    def reset(self) -> None:
        self.counts = Counts()

    def _add_sql_time(self, label: str, started: float) -> None:
        key = f"{self.section}:{label}"
        elapsed = (time.perf_counter() - started) * 1000
        self.counts.sql_ms[key] = self.counts.sql_ms.get(key, 0.0) + elapsed

    def _statement(self, conn: Any, cursor: Any, *_: Any) -> None:
        self._label = _caller()
        self.counts.statements[f"{self.section}:{self._label}"] += 1
        # In autocommit every statement is a transaction of its own on the server.
        if getattr(cursor.connection, "autocommit", False):
            self.counts.transactions[self.section] += 1
        self._started = time.perf_counter()  # last: the labelling is not SQL time

    def _statement_done(self, *_: Any) -> None:
        self._add_sql_time(self._label, self._started)

    def _commit(self, conn: Any) -> None:
        if not getattr(conn.connection.dbapi_connection, "autocommit", False):
            self.counts.transactions[self.section] += 1

    @contextmanager
    def on_behalf(self, section: str) -> Iterator[None]:
        previous, self.section = self.section, section
        try:
            yield
        finally:
            self.section = previous


def install_worker_counter(count_dir: Path) -> None:
    """Count in each pool child; write its running totals to a file after each task
    and, from a thread, whenever they changed since (every 20 ms).

    The mirror commits from its flusher thread after the task has returned, so
    the totals written in ``task_postrun`` miss a batch's last statements: the
    thread writes them once they are there, and the bench waits for the files to
    stop changing (``settled``) before it reads a batch's counts.
    """
    probe = SqlCounter("worker")
    probe.install()
    files: dict[int, int] = {}

    written: dict[int, str] = {}
    lock = threading.Lock()

    def child_start(**_: Any) -> None:
        probe.reset()  # not the parent's counts
        threading.Thread(target=keep_writing, name="wfbench-counts", daemon=True).start()

    def keep_writing() -> None:
        while True:
            time.sleep(0.02)
            write()

    def flush(sender: Any = None, **_: Any) -> None:
        probe.counts.tasks[str(getattr(sender, "name", "?"))] += 1
        write()

    def write() -> None:
        document = json.dumps(probe.counts.as_json())
        pid = os.getpid()
        with lock:
            if written.get(pid) == document:
                return
            written[pid] = document
            _write_file(files, count_dir, pid, document)

    signals.worker_process_init.connect(child_start, weak=False, dispatch_uid="wfbench.start")
    signals.task_postrun.connect(flush, weak=False, dispatch_uid="wfbench.flush")


def _write_file(files: dict[int, int], count_dir: Path, pid: int, document: str) -> None:
    fd = files.get(pid)
    if fd is None:
        path = count_dir / f"worker-{pid}.json"
        fd = files[pid] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    # Kept open and rewritten in place: about 10 us, where a new file and a
    # rename took 200 us, a cost that would fall twice as often on a workflow
    # step (two tasks) as on a chain step. A reader catching it between the
    # truncate and the write sees an empty file and reads again.
    os.ftruncate(fd, 0)
    os.pwrite(fd, document.encode(), 0)


def worker_counts(count_dir: Path) -> Counts:
    total = Counts()
    for path in count_dir.glob("worker-*.json"):
        for _ in range(50):
            try:
                total.add(Counts.from_json(json.loads(path.read_text())))
                break
            except (OSError, ValueError):
                time.sleep(0.001)  # caught between the truncate and the write
        else:
            raise SystemExit(f"cannot read the worker's counts in {path}")
    return total
