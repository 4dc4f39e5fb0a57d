"""The mirror's local journal: every event is appended here before it goes to SQL.

One SQLite file (WAL) per process and mirror, in a folder per database. A
process holds an exclusive ``flock`` on its file's lock while it lives, so a
file whose lock can be taken belongs to a process that is gone (stopped,
recycled, killed): any other process may adopt it, write its events and
delete it. SQLite in WAL mode keeps every committed append through a crash
of the process whatever ``synchronous`` says; ``synchronous=NORMAL`` skips the
fsync, so a crash of the whole machine can lose the last appends.

An event leaves the journal only once the batch holding it has committed. An
event that must wait (its step is not in SQL yet) is deferred in place; one
that can never be written is set aside in the same file, kept for a person
to look at, and never blocks the events behind it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import sqlite3
import tempfile
import threading
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from pikku_celery.store import database_key

__all__ = [
    "ENV_JOURNAL_DIR",
    "SUFFIX",
    "Journal",
    "JournalEntry",
    "database_folder",
    "default_journal_dir",
    "journal_depth",
    "journal_folder",
    "journaled_steps",
    "orphaned_journals",
    "probe_folder",
]

logger = logging.getLogger(__name__)

ENV_JOURNAL_DIR: Final = "PIKKU_JOURNAL_DIR"
SUFFIX: Final = ".journal"

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS events ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, payload TEXT NOT NULL,"
    " not_before REAL NOT NULL DEFAULT 0, deferred_since REAL)",
    "CREATE TABLE IF NOT EXISTS set_aside ("
    " seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL,"
    " reason TEXT NOT NULL, at REAL NOT NULL)",
    # Which database the events are for: adoption writes a journal into that one only.
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


@dataclass(frozen=True, slots=True)
class JournalEntry:
    seq: int
    kind: str
    payload: str
    deferred_since: float | None = None


def default_journal_dir() -> Path:
    """``PIKKU_JOURNAL_DIR``, else the user's state folder, else the temp folder."""
    configured = os.environ.get(ENV_JOURNAL_DIR)
    if configured:
        return Path(configured)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    candidate = Path(state) / "pikku-celery" / "journal"
    try:
        candidate.mkdir(parents=True, exist_ok=True)
    except OSError:
        # A container user without a writable home still gets a journal.
        return Path(tempfile.gettempdir()) / f"pikku-celery-journal-{os.getuid()}"
    return candidate


def journal_folder(root: Path, database: str) -> Path:
    """The folder for one database, from its URL: a journal is only ever written into its
    own database, so two spellings of one database share a folder, and two databases
    spelled alike (a relative SQLite path in two projects) do not."""
    return database_folder(root, database_key(database))


def database_folder(root: Path, key: str) -> Path:
    """The folder for one database, from its :func:`database_key` (what a mirror holds
    already: its engine's URL is SQLAlchemy's, which this layer does not speak)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return root / digest


def probe_folder(folder: Path) -> None:
    """Make the folder and prove a file written there is durable (written, synced,
    removed); ``OSError`` says why it is not."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".probe-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(probe, "wb") as file:
            file.write(b"pikku-celery")
            file.flush()
            os.fsync(file.fileno())
    finally:
        with contextlib.suppress(FileNotFoundError):
            probe.unlink()


class Journal:
    """One journal file, locked for as long as it is open (``OSError`` if another holds it)."""

    def __init__(self, path: Path, database: str | None = None, *, existing: bool = False) -> None:
        """``existing``: adopt the file only if it is there (an adopter must never make
        again a journal its owner has just emptied and deleted)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        lock_path = Path(f"{path}.lock")
        # An adopter makes a lock file only for a journal that is there (one left
        # without its lock file still gets adopted).
        self._lock_file = _take_lock(lock_path, create=not existing or path.exists())
        if existing and not path.exists():
            # Emptied and deleted by its owner: the lock held is the only file left,
            # and it goes as an owner's does, before the flock is let go.
            with contextlib.suppress(FileNotFoundError):
                lock_path.unlink()
            self._lock_file.close()
            raise FileNotFoundError(path)
        self._mutex = threading.Lock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        for statement in _SCHEMA:
            self._db.execute(statement)
        if database is not None:
            self._db.execute(
                "INSERT OR IGNORE INTO meta (name, value) VALUES ('database', ?)",
                (database,),
            )

    @property
    def database(self) -> str | None:
        """The key of the database the events are for (None: a journal that never said)."""
        with self._mutex:
            row = self._db.execute("SELECT value FROM meta WHERE name = 'database'").fetchone()
        return None if row is None else str(row[0])

    @classmethod
    def for_process(
        cls, folder: Path, owner: object = None, database: str | None = None
    ) -> Journal:
        """This process's journal in ``folder`` for ``database`` (its :func:`database_key`);
        ``owner`` tells two mirrors of a process apart."""
        name = f"{socket.gethostname()}-{os.getpid()}-{id(owner):x}{SUFFIX}"
        return cls(folder / name, database)

    def append(self, kind: str, payload: str) -> None:
        """Durable against the death of this process once it returns."""
        with self._mutex:
            self._db.execute("INSERT INTO events (kind, payload) VALUES (?, ?)", (kind, payload))

    def peek(self, limit: int, now: float) -> list[JournalEntry]:
        """The oldest events that are due (not deferred past ``now``), in order."""
        with self._mutex:
            rows = self._db.execute(
                "SELECT seq, kind, payload, deferred_since FROM events"
                " WHERE not_before <= ? ORDER BY seq LIMIT ?",
                (now, limit),
            ).fetchall()
        return [JournalEntry(int(s), str(k), str(p), d) for s, k, p, d in rows]

    def remove(self, seqs: Iterable[int]) -> None:
        # A batch is mostly one unbroken run of seqs: one DELETE per run, not per event.
        spans: list[tuple[int, int]] = []
        for seq in sorted(seqs):
            if spans and seq == spans[-1][1] + 1:
                spans[-1] = (spans[-1][0], seq)
            else:
                spans.append((seq, seq))
        with self._mutex:
            self._db.executemany("DELETE FROM events WHERE seq BETWEEN ? AND ?", spans)

    def defer(self, seqs: Iterable[int], until: float, now: float) -> None:
        """Try these again at ``until``; ``deferred_since`` keeps when they first waited."""
        with self._mutex:
            self._db.executemany(
                "UPDATE events SET not_before = ?, deferred_since = coalesce(deferred_since, ?)"
                " WHERE seq = ?",
                [(until, now, s) for s in seqs],
            )

    def set_aside(self, entry: JournalEntry, reason: str, now: float) -> None:
        """Keep an event that can never be written out of the way, in the same file."""
        with self._mutex:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO set_aside (seq, kind, payload, reason, at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (entry.seq, entry.kind, entry.payload, reason[:2000], now),
                )
                self._db.execute("DELETE FROM events WHERE seq = ?", (entry.seq,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def restore_set_aside(self) -> int:
        """Put the events set aside back in line (the cause was fixed); returns how many."""
        with self._mutex:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                moved = self._db.execute(
                    "INSERT INTO events (seq, kind, payload)"
                    " SELECT seq, kind, payload FROM set_aside"
                ).rowcount
                self._db.execute("DELETE FROM set_aside")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return int(moved)

    def next_due(self) -> float | None:
        """When the earliest event is due (0 for one due now); None when there is none."""
        with self._mutex:
            row = self._db.execute("SELECT min(not_before) FROM events").fetchone()
        return None if row[0] is None else float(row[0])

    def depth(self) -> int:
        with self._mutex:
            return int(self._db.execute("SELECT count(*) FROM events").fetchone()[0])

    def set_aside_count(self) -> int:
        with self._mutex:
            return int(self._db.execute("SELECT count(*) FROM set_aside").fetchone()[0])

    def close(self, *, delete_if_empty: bool = True) -> None:
        with self._mutex:
            empty = (
                self._db.execute(
                    "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM set_aside)"
                ).fetchone()[0]
                == 0
            )
            self._db.close()
        if empty and delete_if_empty:
            # Every file goes while the flock is still held, the lock file last: an
            # adopter that opened the lock file before it went finds its path gone
            # once it gets the flock (see _take_lock), and gives the journal up.
            for leftover in (
                self.path,
                Path(f"{self.path}-wal"),
                Path(f"{self.path}-shm"),
                Path(f"{self.path}.lock"),
            ):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
        self._lock_file.close()  # releases the flock: the file is anybody's now


def _take_lock(path: Path, *, create: bool) -> BinaryIO:
    """The journal's lock file, held with an exclusive ``flock`` (``OSError``: taken).

    A lock file is deleted by the owner of an emptied journal while it still holds
    the flock. Whoever opened it before that and takes the flock after holds a lock
    on a file no longer at the path, which a third could then make again and lock
    too: two adopters of one journal, each deleting it under the other, corrupt it.
    So the flock counts only while the path still names the file locked, and an
    adopter (``create=False``) never makes a lock file again.
    """
    flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
    # Held open: the flock lives as long as the file object does.
    lock = os.fdopen(os.open(path, flags, 0o644), "a+b")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            same = os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            raise FileNotFoundError(path)
    except OSError:
        lock.close()
        raise
    return lock


def orphaned_journals(folder: Path, database: str | None = None) -> Iterator[Journal]:
    """Journals left by processes that are gone, each opened (and locked) for adoption.

    ``database``: only journals of that database (its :func:`database_key`); one that
    says it is for another database is left where it is, with a warning.
    """
    if not folder.is_dir():
        return
    wanted = database
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        try:
            journal = Journal(path, existing=True)
        except OSError:
            continue  # its process is alive, or another process adopted it first
        except sqlite3.Error:
            continue  # being deleted right now by the process that emptied it
        own = journal.database
        if wanted is not None and own is not None and own != wanted:
            logger.warning(
                "pikku-celery leaves journal %s alone: it holds events for %s, not %s",
                path,
                own,
                wanted,
                extra={"action": "journal_of_another_database", "journal": str(path)},
            )
            journal.close(delete_if_empty=False)
            continue
        yield journal


def journal_depth(root: Path, *, only: str = "*", table: str = "events") -> int:
    """Events waiting in every journal under ``root`` (or its database folder ``only``).

    ``table="set_aside"`` counts the events set aside instead.
    """
    if table not in ("events", "set_aside"):
        raise ValueError("table is 'events' or 'set_aside'")
    total = 0
    if not root.is_dir():
        return 0
    query = "SELECT count(*) FROM set_aside" if table == "set_aside" else _COUNT_EVENTS
    for path in root.glob(f"{only}/*{SUFFIX}"):
        try:
            with contextlib.closing(
                sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
            ) as db:
                total += int(db.execute(query).fetchone()[0])
        except sqlite3.Error:
            continue  # being deleted right now, or not a journal
    return total


_COUNT_EVENTS: Final = "SELECT count(*) FROM events"
# Set-aside events count too: an attempt whose outcome is known on this machine but
# could not be written is not lost, and its task must not be sent again.
_STEPS_WAITING: Final = (
    "SELECT json_extract(payload, '$.step_id') FROM events"
    " UNION SELECT json_extract(payload, '$.step_id') FROM set_aside"
)


def journaled_steps(folder: Path, step_ids: Collection[str]) -> set[str]:
    """Which of ``step_ids`` have events waiting (or set aside) in a journal of ``folder``.

    Read-only and without the journals' locks: what a live process holds in
    its journal is exactly what it has not written to SQL yet.
    """
    wanted = set(step_ids)
    found: set[str] = set()
    if not wanted or not folder.is_dir():
        return found
    for path in folder.glob(f"*{SUFFIX}"):
        try:
            with contextlib.closing(
                sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
            ) as db:
                found.update(row[0] for row in db.execute(_STEPS_WAITING) if row[0] in wanted)
        except sqlite3.Error:
            continue  # being deleted right now: its events are in SQL
    return found
