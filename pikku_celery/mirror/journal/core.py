"""A process's journal: :class:`Journal`, what appends to one journal, reads it and
says what has left it, under its locks.

Its methods are for the process that opened it: an append takes one ``os.write``, and
what waits is counted once when the journal is opened, so that its depth costs nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, Literal

from pikku_celery.mirror.forks import process_id
from pikku_celery.mirror.journal.aside import Aside, read_set_aside, write_set_aside
from pikku_celery.mirror.journal.checkpoint import Checkpoint, CheckpointLog, Spans
from pikku_celery.mirror.journal.folders import HOSTED_SUFFIX, SUFFIX, node_suffix
from pikku_celery.mirror.journal.locks import (
    consumer_lock,
    owner_lock,
    take_journal_lock,
    take_lock,
)
from pikku_celery.mirror.journal.meta import read_database, write_database
from pikku_celery.mirror.journal.records import encode_record
from pikku_celery.mirror.journal.segments import (
    JournalTail,
    create_segment,
    segment_firsts,
    segment_name,
)

__all__ = ["SEGMENT_BYTES", "Journal", "JournalEntry", "Role"]

#: What a process does with a journal (see :class:`Journal`).
Role = Literal["own", "append", "consume"]

# A segment full past this takes no more records: a consumed segment is deleted whole,
# so this bounds what a journal keeps on disk behind its oldest waiting event.
SEGMENT_BYTES: Final = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class JournalEntry:
    seq: int
    kind: str
    payload: str
    deferred_since: float | None = None


class Journal:
    """One journal, locked for as long as it is open (``OSError`` if another holds it).

    Its methods are for the process that opened it: a forked child makes its own.
    """

    def __init__(
        self,
        path: Path,
        database: str | None = None,
        *,
        existing: bool = False,
        role: Role = "own",
    ) -> None:
        """``existing``: adopt the journal only if it is there (an adopter must never make
        again a journal its owner has just emptied and deleted).

        ``role``: ``"own"`` appends and writes (or adopts) the journal; ``"append"``
        appends only, while another process of the node consumes it; ``"consume"``
        writes a journal its living owner appends to (see :meth:`owner_gone`).
        """
        if role not in ("own", "append", "consume"):
            raise ValueError(f"a journal's role is own, append or consume, not {role!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.role: Role = role
        self._lock_file: BinaryIO | None = None
        self._consumer_file: BinaryIO | None = None
        try:
            if role != "consume":
                self._lock_file = take_journal_lock(owner_lock(path), path, existing=existing)
            if role != "append":
                if role == "consume" and not path.exists():
                    raise FileNotFoundError(path)
                # Whoever writes a journal holds this: one consumer at a time, and an
                # adopter leaves alone a journal a node's flusher consumes.
                self._consumer_file = take_journal_lock(
                    consumer_lock(path), path, existing=existing or role == "consume"
                )
            self._open(database)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        for held in (self._consumer_file, self._lock_file):
            if held is not None:
                held.close()
        self._consumer_file = self._lock_file = None

    @property
    def external(self) -> bool:
        """Whether another process appends to this journal (so reading finds more)."""
        return self.role == "consume"

    def owner_gone(self) -> bool:
        """For a consumer: whether the process that appends is gone, in which case this
        journal is now its own (it can be emptied and deleted). Takes the owner's lock."""
        if self._lock_file is not None:
            return True
        try:
            self._lock_file = take_lock(owner_lock(self.path), create=False)
        except OSError:
            return False
        return True

    def _open(self, database: str | None) -> None:
        path = self.path
        path.mkdir(exist_ok=True)
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._fd: int | None = None  # the segment appended to; made at the first append
        self._size = self._header_size = 0
        self._database = read_database(path)
        if database is not None and self._database is None:
            write_database(path, database)
            self._database = database
        checkpoint = Checkpoint.read(path)
        self._checkpoints = CheckpointLog(path)
        self._aside = read_set_aside(path)
        self._skip = Spans(checkpoint.removed)
        for seq in self._aside:
            self._skip.add(seq)  # set aside, then a crash before the checkpoint said so
        self._segments = segment_firsts(path)
        # What waits: every record from the checkpoint on that has not left. Read once
        # here, so that depth() costs nothing; the records themselves are read as peeked.
        counting = JournalTail(path, checkpoint.low)
        self._unloaded = 0
        try:
            while batch := counting.read(4096):
                self._unloaded += sum(1 for seq, _, _ in batch if seq not in self._skip)
            # Past every seq the files name: after a crash of the machine, the checkpoint
            # may outlive records it counted, and a new record must not take their seqs.
            self._end = max(
                counting.next_seq,
                checkpoint.low,
                *(last + 1 for _, last in checkpoint.removed),
                *(seq + 1 for seq in self._aside),
                *self._segments[-1:],
            )
        finally:
            counting.close()
        self._tail = JournalTail(path, checkpoint.low)
        self._window: dict[int, JournalEntry] = {}  # read, waiting, in order of seq
        self._deferred: dict[int, tuple[float, float]] = {
            seq: (not_before, since)
            for seq, not_before, since in checkpoint.deferred
            if self._waiting(seq)
        }
        self._written: Checkpoint | None = checkpoint

    @property
    def database(self) -> str | None:
        """The key of the database the events are for (None: a journal that never said)."""
        return self._database

    @classmethod
    def for_process(
        cls,
        folder: Path,
        owner: object = None,
        database: str | None = None,
        *,
        role: Role = "own",
        node: int | None = None,
        hosted: bool = False,
    ) -> Journal:
        """This process's journal in ``folder`` for ``database`` (its :func:`database_key`);
        ``owner`` tells two mirrors of a process apart; ``node``: the pid of the process
        that consumes it (see :func:`node_suffix`); ``hosted``: any node's flusher on this
        machine may consume it (see ``HOSTED_SUFFIX``)."""
        ending = HOSTED_SUFFIX if hosted else SUFFIX if node is None else node_suffix(node)
        name = f"{socket.gethostname()}-{os.getpid()}-{id(owner):x}{ending}"
        return cls(folder / name, database, role=role)

    def append(self, kind: str, payload: str | bytes) -> None:
        """Durable against the death of this process once it returns (``payload``: the
        event's JSON, as text or UTF-8)."""
        record = encode_record(kind, payload)
        with self._mutex:
            if self._pid != process_id() or self.role == "consume":
                raise RuntimeError(f"journal {self.path} belongs to the process that opened it")
            if self._fd is None or (
                self._size + len(record) > SEGMENT_BYTES and self._size > self._header_size
            ):
                self._rotate()
            assert self._fd is not None
            written = os.write(self._fd, record)
            if written != len(record):
                # A full disk: what was written is no record, and the next must not follow it.
                os.ftruncate(self._fd, self._size)
                raise OSError(errno.ENOSPC, f"journal {self.path}: a record cut short")
            self._size += written
            self._end += 1
            self._unloaded += 1

    def _rotate(self) -> None:
        """A new segment, starting at the next seq: never one left by another process,
        whose last record may be cut short."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        first = self._end
        self._fd, self._size = create_segment(self.path, first, self._database)
        self._header_size = self._size  # a segment takes one record however long it is
        if first not in self._segments:
            self._segments.append(first)

    def _waiting(self, seq: int) -> bool:
        """Whether ``seq`` is an event in line (read or not yet): not left, not set aside."""
        if seq in self._window:
            return True
        aside = self._aside.get(seq)
        if aside is not None:
            return aside.restored
        return self._tail.next_seq <= seq < self._end and seq not in self._skip

    def _due(self, seq: int, now: float) -> bool:
        deferred = self._deferred.get(seq)
        return deferred is None or deferred[0] <= now

    def _entry(self, entry: JournalEntry) -> JournalEntry:
        deferred = self._deferred.get(entry.seq)
        if deferred is None:
            return entry
        return JournalEntry(entry.seq, entry.kind, entry.payload, deferred[1])

    def peek(self, limit: int, now: float) -> list[JournalEntry]:
        """The oldest events that are due (not deferred past ``now``), in order."""
        with self._mutex:
            due: list[JournalEntry] = []
            for seq, entry in self._window.items():
                if len(due) >= limit:
                    break
                if self._due(seq, now):
                    due.append(self._entry(entry))
            while len(due) < limit and (self._unloaded > 0 or self.external):
                loaded = self._load(limit - len(due))
                if not loaded:
                    # Nothing more on disk: a count that says otherwise would keep the
                    # journal (and its flusher) busy for good.
                    self._unloaded = 0
                    break
                due.extend(self._entry(e) for e in loaded if self._due(e.seq, now))
            restored = [
                self._entry(JournalEntry(a.seq, a.kind, a.payload))
                for a in self._aside.values()
                if a.restored and self._due(a.seq, now)
            ]
            if restored:
                due = sorted([*due, *restored], key=lambda e: e.seq)
            return due[:limit]

    def _load(self, wanted: int) -> list[JournalEntry]:
        """Read up to ``wanted`` more waiting events into the window."""
        loaded: list[JournalEntry] = []
        while len(loaded) < wanted:
            batch = self._tail.read(wanted - len(loaded))
            if not batch:
                break
            for seq, kind, payload in batch:
                if seq in self._skip:
                    continue
                entry = JournalEntry(seq, kind, payload)
                self._window[seq] = entry
                loaded.append(entry)
                self._unloaded = max(self._unloaded - 1, 0)
        self._end = max(self._end, self._tail.next_seq)
        return loaded

    def _take(self, seq: int) -> bool:
        """Take ``seq`` out of line; True when it was a restored event (in the set-aside
        file, which must then be written)."""
        self._deferred.pop(seq, None)
        if self._window.pop(seq, None) is not None:
            return False
        aside = self._aside.get(seq)
        if aside is not None:
            if aside.restored:
                del self._aside[seq]
                return True
            return False
        if self._tail.next_seq <= seq < self._end and seq not in self._skip:
            self._skip.add(seq)  # left before it was read (it need not be peeked first)
            self._unloaded -= 1
        return False

    def remove(self, seqs: Iterable[int]) -> None:
        with self._mutex:
            restored = False
            for seq in seqs:
                restored = self._take(seq) or restored
            if restored:
                write_set_aside(self.path, self._aside.values())
            self._checkpoint()

    def defer(self, seqs: Iterable[int], until: float, now: float) -> None:
        """Try these again at ``until``; ``deferred_since`` keeps when they first waited."""
        with self._mutex:
            for seq in seqs:
                if self._waiting(seq):
                    since = self._deferred.get(seq, (0.0, now))[1]
                    self._deferred[seq] = (until, since)
            self._checkpoint()

    def set_aside(self, entry: JournalEntry, reason: str, now: float) -> None:
        """Keep an event that can never be written out of the way, in the set-aside file."""
        with self._mutex:
            self._deferred.pop(entry.seq, None)
            if entry.seq not in self._aside:
                self._take(entry.seq)
            # Written before the checkpoint says the event left: after a crash between
            # the two, it is both set aside and in line, and counts once (see _open).
            self._aside[entry.seq] = Aside(
                entry.seq, entry.kind, entry.payload, reason[:2000], now, restored=False
            )
            write_set_aside(self.path, self._aside.values())
            self._checkpoint()

    def restore_set_aside(self) -> int:
        """Put the events set aside back in line (the cause was fixed); returns how many."""
        with self._mutex:
            moved = [a for a in self._aside.values() if not a.restored]
            for aside in moved:
                aside.restored = True
            if moved:
                write_set_aside(self.path, self._aside.values())
        return len(moved)

    def _checkpoint(self) -> None:
        """Say what has left (when that changed), then delete the segments that hold
        nothing else."""
        cursor = self._tail.next_seq
        self._skip.drop_below(cursor)
        low = next(iter(self._window), cursor)
        removed: list[tuple[int, int]] = []
        expected = low
        for seq in self._window:
            if seq > expected:
                removed.append((expected, seq - 1))
            expected = seq + 1
        if expected < cursor:
            removed.append((expected, cursor - 1))
        removed.extend(self._skip.spans())
        checkpoint = Checkpoint(
            low,
            tuple(removed),
            tuple((seq, until, since) for seq, (until, since) in self._deferred.items()),
        )
        if checkpoint != self._written:
            self._checkpoints.write(checkpoint)
            self._written = checkpoint
        if self.external:
            self._segments = segment_firsts(self.path)  # its owner makes them
        while len(self._segments) > 1 and self._segments[1] <= low:
            with contextlib.suppress(FileNotFoundError):
                (self.path / segment_name(self._segments.pop(0))).unlink()

    def next_due(self) -> float | None:
        """When the earliest event is due (0 for one due now); None when there is none."""
        with self._mutex:
            if self.external and len(self._window) <= len(self._deferred):
                self._load(1)  # appended by another process since the last look?
            waiting = self._depth()
            if waiting == 0:
                return None
            if waiting > len(self._deferred):
                return 0.0
            return min(until for until, _ in self._deferred.values())

    def _depth(self) -> int:
        restored = sum(1 for a in self._aside.values() if a.restored) if self._aside else 0
        return len(self._window) + self._unloaded + restored

    def depth(self) -> int:
        with self._mutex:
            return self._depth()

    def set_aside_count(self) -> int:
        with self._mutex:
            return sum(1 for a in self._aside.values() if not a.restored)

    def close(self, *, delete_if_empty: bool = True) -> None:
        """Let the journal go; an empty one is deleted when nobody appends to it any more
        (never by a process that only appends: its consumer deletes it)."""
        with self._mutex:
            if self.external and self._lock_file is not None:
                self._load(1)  # its owner is gone: a last record it wrote counts too
            empty = self._depth() == 0 and not self._aside
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._checkpoints.close()
            self._tail.close()
        if empty and delete_if_empty and self.role != "append" and self._lock_file is not None:
            # Every file goes while the flocks are still held, the lock file last: an
            # adopter that opened the lock file before it went finds its path gone
            # once it gets the flock (see take_lock), and gives the journal up.
            with contextlib.suppress(FileNotFoundError):
                for leftover in os.listdir(self.path):
                    with contextlib.suppress(FileNotFoundError):
                        (self.path / leftover).unlink()
            with contextlib.suppress(FileNotFoundError):
                self.path.rmdir()
            for lock in (consumer_lock(self.path), owner_lock(self.path)):
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
        self._release()  # releases the flocks: the journal is anybody's now
