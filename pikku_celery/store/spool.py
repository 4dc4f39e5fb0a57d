"""The mirror's local spool: events that could not reach the database wait here, in order.

One SQLite file (WAL) per process, in a folder per database. A process holds
an exclusive ``flock`` on its file's lock while it lives, so a file whose lock
can be taken belongs to a process that is gone (stopped, recycled, killed):
any other process may adopt it, replay it and delete it. SQLite's WAL with
``synchronous=NORMAL`` keeps every appended event through a crash of the
process; only a crash of the whole machine can lose the last few.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "ENV_SPOOL_DIR",
    "Spool",
    "SpooledEvent",
    "default_spool_dir",
    "orphaned_spools",
    "spool_depth",
    "spool_folder",
]

ENV_SPOOL_DIR: Final = "PIKKU_SPOOL_DIR"
_SUFFIX: Final = ".spool"


@dataclass(frozen=True, slots=True)
class SpooledEvent:
    seq: int
    kind: str
    payload: str


def default_spool_dir() -> Path:
    """``PIKKU_SPOOL_DIR``, else the user's state folder, else the temp folder."""
    configured = os.environ.get(ENV_SPOOL_DIR)
    if configured:
        return Path(configured)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    candidate = Path(state) / "pikku-celery" / "spool"
    try:
        candidate.mkdir(parents=True, exist_ok=True)
    except OSError:
        # A container user without a writable home still gets a spool.
        return Path(tempfile.gettempdir()) / f"pikku-celery-spool-{os.getuid()}"
    return candidate


def spool_folder(root: Path, database_key: str) -> Path:
    """The folder for one database: a spool is only ever replayed into its own database."""
    digest = hashlib.sha256(database_key.encode()).hexdigest()[:16]
    return root / digest


class Spool:
    """This process's spool file; made on first use, locked for as long as it is open."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock_file = open(f"{path}.lock", "a+b")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise
        self._mutex = threading.Lock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS events ("
            "seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, payload TEXT NOT NULL)"
        )

    @classmethod
    def for_process(cls, folder: Path, owner: object = None) -> Spool:
        """This process's spool in ``folder``; ``owner`` tells apart two writers in one process."""
        name = f"{socket.gethostname()}-{os.getpid()}-{id(owner):x}{_SUFFIX}"
        return cls(folder / name)

    def append(self, kind: str, payload: str) -> None:
        with self._mutex:
            self._db.execute("INSERT INTO events (kind, payload) VALUES (?, ?)", (kind, payload))

    def peek(self, limit: int = 200) -> list[SpooledEvent]:
        with self._mutex:
            rows = self._db.execute(
                "SELECT seq, kind, payload FROM events ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        return [SpooledEvent(int(seq), str(kind), str(payload)) for seq, kind, payload in rows]

    def remove_through(self, seq: int) -> None:
        with self._mutex:
            self._db.execute("DELETE FROM events WHERE seq <= ?", (seq,))

    def depth(self) -> int:
        with self._mutex:
            return int(self._db.execute("SELECT count(*) FROM events").fetchone()[0])

    def close(self, *, delete_if_empty: bool = True) -> None:
        with self._mutex:
            empty = self._db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
            self._db.close()
        if empty and delete_if_empty:
            for leftover in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
        self._lock_file.close()  # releases the flock: the file is anybody's now
        if empty and delete_if_empty:
            with contextlib.suppress(FileNotFoundError):
                Path(f"{self.path}.lock").unlink()


def orphaned_spools(folder: Path) -> Iterator[Spool]:
    """Spools left by processes that are gone, each opened (and locked) for replay."""
    if not folder.is_dir():
        return
    for path in sorted(folder.glob(f"*{_SUFFIX}")):
        try:
            spool = Spool(path)
        except OSError:
            continue  # its process is alive, or another process adopted it first
        yield spool


def spool_depth(root: Path, *, only: str = "*") -> int:
    """Events waiting in every spool under ``root`` (or its database folder ``only``)."""
    total = 0
    if not root.is_dir():
        return 0
    for path in root.glob(f"{only}/*{_SUFFIX}"):
        try:
            with contextlib.closing(
                sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
            ) as db:
                total += int(db.execute("SELECT count(*) FROM events").fetchone()[0])
        except sqlite3.Error:
            continue  # being deleted right now, or not a spool
    return total
