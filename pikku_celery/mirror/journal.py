"""The mirror's local journal: every event is appended here before it goes to SQL.

One journal per process and mirror, in a folder per database: a directory of
append-only segment files. An append is one ``os.write`` of a length-prefixed,
checksummed record to a descriptor opened with ``O_APPEND``; once it returns,
the kernel holds the record, so it outlives the death of the process at any
instant (not a crash of the machine: nothing is synced, as with SQLite's
``synchronous=NORMAL`` before). A record cut short or damaged ends its segment
for every reader; a new owner never appends after it, it starts a segment of its
own. A record's seq is its ordinal in the journal, so another process can read a
journal while it grows (:class:`JournalTail`) without any lock.

A process holds an exclusive ``flock`` on its journal's lock file while it lives,
so a journal whose lock can be taken belongs to a process that is gone (stopped,
recycled, killed): any other process may adopt it, write its events and delete it.
Whoever writes a journal to SQL holds a second lock, ``<journal>.consumer``: the
owner itself, or, for a worker's pool process that only appends (role
``"append"``), the worker's main process (role ``"consume"``); an adopter needs
both locks, so it never takes a journal from under its consumer.

An event leaves the journal only once the batch holding it has committed. What
has left is kept in memory and in a checkpoint file, one checksummed record appended
per change (the last whole one counts), without a sync: a batch written twice
changes nothing in SQL, so events read again after a crash are harmless. A segment
goes once every record in it has left. An event that must wait (its step is not in
SQL yet) is deferred in place; one that can never be written is set aside in a file
of its own, one JSON line per event for a person to read, and never blocks the
events behind it.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import sqlite3
import struct
import tempfile
import threading
import zlib
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final, Literal

from pikku_celery.store import database_key

__all__ = [
    "ENV_JOURNAL_DIR",
    "SEGMENT_BYTES",
    "SUFFIX",
    "Journal",
    "JournalEntry",
    "JournalTail",
    "Role",
    "database_folder",
    "default_journal_dir",
    "journal_depth",
    "journal_folder",
    "journaled_steps",
    "node_suffix",
    "orphaned_journals",
    "owner_alive",
    "probe_folder",
]

logger = logging.getLogger(__name__)

#: What a process does with a journal (see :class:`Journal`).
Role = Literal["own", "append", "consume"]

ENV_JOURNAL_DIR: Final = "PIKKU_JOURNAL_DIR"
SUFFIX: Final = ".journal"

# A segment full past this takes no more records: a consumed segment is deleted whole,
# so this bounds what a journal keeps on disk behind its oldest waiting event.
SEGMENT_BYTES: Final = 8 * 1024 * 1024

# Each segment starts with this, then a header record (its first seq, the database).
_MAGIC: Final = b"PKJSEG1\n"
_SEGMENT_SUFFIX: Final = ".seg"
_HEADER_KIND: Final = "segment"
# A record: its body's length, the crc32 of that length and the body, the body (one
# byte for the kind's length, the kind, the payload; UTF-8).
_U32: Final = struct.Struct("<I")
_HEAD: Final = struct.Struct("<II")
# No event comes near this: a length past it is damage, not a record to wait for.
_MAX_BODY: Final = 1 << 30
_CHUNK: Final = 256 * 1024
_HEADER_READ: Final = 64 * 1024

# What has left a journal: one record appended per change (a rename per batch cost more
# than the rest of the batch's file work), the last whole record counting; rewritten
# whole past this size, and whenever a process starts writing it (its tail may be torn).
_CHECKPOINT: Final = "consumed.log"
_CHECKPOINT_KIND: Final = "checkpoint"
_CHECKPOINT_BYTES: Final = 256 * 1024
# Where an earlier version kept it, rewritten by a rename per change: read when there is
# no log yet.
_CHECKPOINT_BEFORE: Final = "consumed.json"
# Beside ``<journal>.lock``: held by the process that writes the journal to SQL.
_CONSUMER: Final = ".consumer"
_SET_ASIDE: Final = "set-aside.jsonl"
_META: Final = "meta.json"


@dataclass(frozen=True, slots=True)
class JournalEntry:
    seq: int
    kind: str
    payload: str
    deferred_since: float | None = None


@dataclass(slots=True)
class _Aside:
    """An event set aside (``restored``: put back in line, not written yet)."""

    seq: int
    kind: str
    payload: str
    reason: str
    at: float
    restored: bool = False


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


# --- the record format ------------------------------------------------------------------

_KIND_PREFIXES: dict[str, bytes] = {}


def _kind_prefix(kind: str) -> bytes:
    prefix = _KIND_PREFIXES.get(kind)
    if prefix is None:
        raw = kind.encode()
        if len(raw) > 255:
            raise ValueError(f"an event kind is at most 255 bytes: {kind[:40]!r}…")
        prefix = _KIND_PREFIXES.setdefault(kind, bytes((len(raw),)) + raw)
    return prefix


def _record(kind: str, payload: str) -> bytes:
    body = _kind_prefix(kind) + payload.encode()
    length = _U32.pack(len(body))
    return length + _U32.pack(zlib.crc32(body, zlib.crc32(length))) + body


def _parse(buffer: bytes, pos: int) -> tuple[int, str, str] | int:
    """The record at ``pos``: (its end, kind, payload); else the bytes from ``pos`` it needs
    to be whole (more than the buffer holds), or -1 for bytes that are no record."""
    if len(buffer) - pos < _HEAD.size:
        return _HEAD.size
    length: int
    crc: int
    length, crc = _HEAD.unpack_from(buffer, pos)
    if length == 0 or length > _MAX_BODY:
        return -1
    end = pos + _HEAD.size + length
    if end > len(buffer):
        return _HEAD.size + length
    body = buffer[pos + _HEAD.size : end]
    if zlib.crc32(body, zlib.crc32(buffer[pos : pos + 4])) != crc:
        return -1
    size = body[0]
    if 1 + size > length:
        return -1
    try:
        return end, body[1 : 1 + size].decode(), body[1 + size :].decode()
    except UnicodeDecodeError:
        return -1


def _segment_name(first: int) -> str:
    return f"{first:020d}{_SEGMENT_SUFFIX}"


def _segment_firsts(path: Path) -> list[int]:
    """The first seq of each segment of a journal, in order (none: no journal there)."""
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    firsts = []
    for name in names:
        stem, dot, suffix = name.partition(".")
        if dot and f".{suffix}" == _SEGMENT_SUFFIX and stem.isdigit():
            firsts.append(int(stem))
    return sorted(firsts)


class JournalTail:
    """A journal's records in order, ``(seq, kind, payload)``, as they are appended.

    For any process, without the journal's lock: it reads what every ``write`` that
    returned has put in the segments, stops before a record not whole yet, and reads
    it at the next :meth:`read` once it is. A segment with a newer one behind it gets
    no more records, so what follows a damaged or cut record there is dropped, for
    every reader alike. Records before ``start`` are skipped.
    """

    def __init__(self, path: Path, start: int = 1) -> None:
        self.path = path
        self._floor = start
        self._fd: int | None = None
        self._first = 0
        self._offset = 0  # 0: the segment's header is still to read
        self._seq = start
        self.database: str | None = None  # as the current segment's header says

    @property
    def next_seq(self) -> int:
        """The seq the next record read will have (one past the last one read)."""
        return self._seq

    def read(self, limit: int) -> list[tuple[int, str, str]]:
        """At most ``limit`` records that follow the last one read (none: none yet)."""
        out: list[tuple[int, str, str]] = []
        while len(out) < limit:
            if self._fd is not None:
                self._read_segment(out, limit)
                if len(out) >= limit:
                    break
            newer = self._newer()
            if newer is None:
                break
            if self._fd is not None:
                # Its writer made the newer one only after its last write here returned.
                self._read_segment(out, limit)
                if len(out) >= limit:
                    break
            self._open(newer)
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _newer(self) -> int | None:
        firsts = _segment_firsts(self.path)
        if self._fd is None:
            below = [first for first in firsts if first <= self._seq]
            return below[-1] if below else (firsts[0] if firsts else None)
        later = [first for first in firsts if first > self._first]
        return later[0] if later else None

    def _open(self, first: int) -> None:
        try:
            fd = os.open(self.path / _segment_name(first), os.O_RDONLY)
        except FileNotFoundError:
            # Consumed and deleted since the listing: the next one lists what is left.
            self.close()
            self._first = first
            return
        self.close()
        self._fd, self._first, self._offset = fd, first, 0
        # The name says where a segment starts, whatever an earlier one lost at its end;
        # a seq read already is never read again.
        self._floor = max(self._floor, self._seq)
        self._seq = first

    def _read_segment(self, out: list[tuple[int, str, str]], limit: int) -> None:
        fd = self._fd
        assert fd is not None
        if self._offset == 0 and not self._read_header(fd):
            return
        size = _CHUNK
        while len(out) < limit:
            buffer = os.pread(fd, size, self._offset)
            pos = need = 0
            while len(out) < limit:
                parsed = _parse(buffer, pos)
                if isinstance(parsed, int):
                    need = parsed
                    break
                pos, kind, payload = parsed
                if self._seq >= self._floor:
                    out.append((self._seq, kind, payload))
                self._seq += 1
            self._offset += pos
            if pos == 0:
                if need > size and len(buffer) == size:
                    size = need  # one record longer than a chunk: read it whole
                    continue
                return
            if len(buffer) < size:
                return
            size = _CHUNK

    def _read_header(self, fd: int) -> bool:
        head = os.pread(fd, _HEADER_READ, 0)
        if head[: len(_MAGIC)] != _MAGIC:
            return False  # being made, or not a segment
        parsed = _parse(head, len(_MAGIC))
        if isinstance(parsed, int):
            return False
        end, kind, payload = parsed
        if kind != _HEADER_KIND:
            return False
        with contextlib.suppress(ValueError, AttributeError):
            database = json.loads(payload).get("database")
            self.database = database if isinstance(database, str) else None
        self._offset = end
        return True


# --- small files beside the segments ---------------------------------------------------


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers see the old contents or the new, never a mix (no sync: see the module)."""
    temporary = path.with_name(f"{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(temporary, path)


def _read_json(path: Path) -> Any:
    """The file's JSON; None when it is missing or unreadable (a crash of the machine can
    leave a file renamed but empty, and what it said is only an optimisation)."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


@dataclass(slots=True)
class _Checkpoint:
    """What has left a journal: every seq below ``low``, and the spans ``removed``."""

    low: int = 1
    removed: tuple[tuple[int, int], ...] = ()
    deferred: tuple[tuple[int, float, float], ...] = ()

    @classmethod
    def read(cls, path: Path) -> _Checkpoint:
        """The last whole checkpoint its consumer wrote (a torn last one is ignored)."""
        data = _last_checkpoint(path / _CHECKPOINT)
        if data is None:
            data = _read_json(path / _CHECKPOINT_BEFORE)
        try:
            return cls(
                int(data["low"]),
                tuple((int(a), int(b)) for a, b in data["removed"]),
                tuple((int(s), float(n), float(d)) for s, n, d in data["deferred"]),
            )
        except (TypeError, KeyError, ValueError):
            return cls()

    def encoded(self) -> bytes:
        data = {"low": self.low, "removed": self.removed, "deferred": self.deferred}
        return _record(_CHECKPOINT_KIND, json.dumps(data, separators=(",", ":")))


def _last_checkpoint(path: Path) -> Any:
    try:
        buffer = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    last: str | None = None
    pos = 0
    while True:
        parsed = _parse(buffer, pos)
        if isinstance(parsed, int):
            break  # the end, or a record its writer did not finish
        pos, kind, payload = parsed
        if kind == _CHECKPOINT_KIND:
            last = payload
    if last is None:
        return None
    try:
        return json.loads(last)
    except ValueError:
        return None


class _CheckpointLog:
    """The consumer's side of a journal's checkpoint file: a record appended per change.

    A reader sees the old checkpoint or the new, never a mix: it takes the last record
    whose checksum holds. No sync, as for the segments.
    """

    def __init__(self, path: Path) -> None:
        self._path = path / _CHECKPOINT
        self._fd: int | None = None
        self._size = 0

    def write(self, checkpoint: _Checkpoint) -> None:
        record = checkpoint.encoded()
        if self._fd is None or self._size + len(record) > _CHECKPOINT_BYTES:
            self._rewrite(record)
            return
        written = os.write(self._fd, record)
        if written != len(record):
            # A full disk: a record cut short would hide every later one from readers.
            os.ftruncate(self._fd, self._size)
            raise OSError(errno.ENOSPC, f"journal checkpoint {self._path}: a record cut short")
        self._size += written

    def _rewrite(self, record: bytes) -> None:
        """The file anew with one record: the first write of a process (a consumer before
        it may have died in the middle of a record) and whenever it has grown long."""
        self.close()
        _write_atomically(self._path, record)
        with contextlib.suppress(FileNotFoundError):
            (self._path.parent / _CHECKPOINT_BEFORE).unlink()
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._size = len(record)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_set_aside(path: Path) -> dict[int, _Aside]:
    aside: dict[int, _Aside] = {}
    try:
        lines = (path / _SET_ASIDE).read_bytes().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return aside
    for line in lines:
        try:
            data = json.loads(line)
            entry = _Aside(
                int(data["seq"]),
                str(data["kind"]),
                str(data["payload"]),
                str(data["reason"]),
                float(data["at"]),
                bool(data.get("restored", False)),
            )
        except (TypeError, KeyError, ValueError):
            continue  # a line a person broke: the others still count
        aside[entry.seq] = entry
    return aside


def _write_set_aside(path: Path, aside: Iterable[_Aside]) -> None:
    lines = [
        json.dumps(
            {
                "seq": a.seq,
                "kind": a.kind,
                "payload": a.payload,
                "reason": a.reason,
                "at": a.at,
                "restored": a.restored,
            }
        )
        for a in sorted(aside, key=lambda a: a.seq)
    ]
    if lines:
        _write_atomically(path / _SET_ASIDE, ("\n".join(lines) + "\n").encode())
    else:
        with contextlib.suppress(FileNotFoundError):
            (path / _SET_ASIDE).unlink()


class _Spans:
    """Sorted, disjoint spans of seqs ``(first, last)``: records to skip when read."""

    def __init__(self, spans: Iterable[tuple[int, int]] = ()) -> None:
        self._spans: list[tuple[int, int]] = []
        for first, last in sorted(spans):
            self._merge(first, last)

    def _merge(self, first: int, last: int) -> None:
        if self._spans and first <= self._spans[-1][1] + 1:
            self._spans[-1] = (self._spans[-1][0], max(last, self._spans[-1][1]))
        else:
            self._spans.append((first, last))

    def add(self, seq: int) -> None:
        spans, self._spans = [*self._spans, (seq, seq)], []
        for first, last in sorted(spans):
            self._merge(first, last)

    def __contains__(self, seq: int) -> bool:
        at = bisect.bisect_right(self._spans, (seq, float("inf"))) - 1
        return at >= 0 and self._spans[at][1] >= seq

    def drop_below(self, seq: int) -> None:
        self._spans = [(max(a, seq), b) for a, b in self._spans if b >= seq]

    def spans(self) -> list[tuple[int, int]]:
        return list(self._spans)


# --- a process's journal ----------------------------------------------------------------


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
                self._lock_file = _take_journal_lock(Path(f"{path}.lock"), path, existing=existing)
            if role != "append":
                if role == "consume" and not path.exists():
                    raise FileNotFoundError(path)
                # Whoever writes a journal holds this: one consumer at a time, and an
                # adopter leaves alone a journal a node's flusher consumes.
                self._consumer_file = _take_journal_lock(
                    Path(f"{path}{_CONSUMER}"), path, existing=existing or role == "consume"
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
            self._lock_file = _take_lock(Path(f"{self.path}.lock"), create=False)
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
        self._database = _read_database(path)
        if database is not None and self._database is None:
            _write_atomically(path / _META, json.dumps({"database": database}).encode())
            self._database = database
        checkpoint = _Checkpoint.read(path)
        self._checkpoints = _CheckpointLog(path)
        self._aside = _read_set_aside(path)
        self._skip = _Spans(checkpoint.removed)
        for seq in self._aside:
            self._skip.add(seq)  # set aside, then a crash before the checkpoint said so
        self._segments = _segment_firsts(path)
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
        self._written: _Checkpoint | None = checkpoint

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
    ) -> Journal:
        """This process's journal in ``folder`` for ``database`` (its :func:`database_key`);
        ``owner`` tells two mirrors of a process apart; ``node``: the pid of the process
        that consumes it (see :func:`node_suffix`)."""
        marker = "" if node is None else node_suffix(node)[: -len(SUFFIX)]
        name = f"{socket.gethostname()}-{os.getpid()}-{id(owner):x}{marker}{SUFFIX}"
        return cls(folder / name, database, role=role)

    def append(self, kind: str, payload: str) -> None:
        """Durable against the death of this process once it returns."""
        record = _record(kind, payload)
        with self._mutex:
            if self._pid != os.getpid() or self.role == "consume":
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
        segment = self.path / _segment_name(first)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
        try:
            fd = os.open(segment, flags, 0o644)
        except FileExistsError:
            # Made by an owner that died before its first record there: it holds none.
            segment.unlink()
            fd = os.open(segment, flags, 0o644)
        header = json.dumps({"first": first, "database": self._database})
        data = _MAGIC + _record(_HEADER_KIND, header)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, f"journal segment {segment}: header cut short")
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                segment.unlink()
            raise
        self._fd, self._size = fd, len(data)
        self._header_size = len(data)  # a segment takes one record however long it is
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
                _write_set_aside(self.path, self._aside.values())
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
            self._aside[entry.seq] = _Aside(
                entry.seq, entry.kind, entry.payload, reason[:2000], now, restored=False
            )
            _write_set_aside(self.path, self._aside.values())
            self._checkpoint()

    def restore_set_aside(self) -> int:
        """Put the events set aside back in line (the cause was fixed); returns how many."""
        with self._mutex:
            moved = [a for a in self._aside.values() if not a.restored]
            for aside in moved:
                aside.restored = True
            if moved:
                _write_set_aside(self.path, self._aside.values())
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
        checkpoint = _Checkpoint(
            low,
            tuple(removed),
            tuple((seq, until, since) for seq, (until, since) in self._deferred.items()),
        )
        if checkpoint != self._written:
            self._checkpoints.write(checkpoint)
            self._written = checkpoint
        if self.external:
            self._segments = _segment_firsts(self.path)  # its owner makes them
        while len(self._segments) > 1 and self._segments[1] <= low:
            with contextlib.suppress(FileNotFoundError):
                (self.path / _segment_name(self._segments.pop(0))).unlink()

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
            # once it gets the flock (see _take_lock), and gives the journal up.
            with contextlib.suppress(FileNotFoundError):
                for leftover in os.listdir(self.path):
                    with contextlib.suppress(FileNotFoundError):
                        (self.path / leftover).unlink()
            with contextlib.suppress(FileNotFoundError):
                self.path.rmdir()
            for lock in (f"{self.path}{_CONSUMER}", f"{self.path}.lock"):
                with contextlib.suppress(FileNotFoundError):
                    Path(lock).unlink()
        self._release()  # releases the flocks: the journal is anybody's now


def _read_database(path: Path) -> str | None:
    """The database a journal is for: its meta file, else its first segment's header
    (the same key, written with the records themselves)."""
    meta = _read_json(path / _META)
    if isinstance(meta, dict) and isinstance(meta.get("database"), str):
        return str(meta["database"])
    for first in _segment_firsts(path):
        tail = JournalTail(path, first)
        try:
            tail.read(1)
            if tail.database is not None:
                return tail.database
        finally:
            tail.close()
    return None


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


def node_suffix(node: int) -> str:
    """How the journals of the pool processes of node ``node`` (its main process's pid)
    end: it claims them as soon as they appear, and those of another node only once
    their owner is gone."""
    return f"-node{node}{SUFFIX}"


def owner_alive(path: Path) -> bool:
    """Whether a process holds the journal's owner lock; nothing of the journal is read."""
    try:
        lock = _take_lock(Path(f"{path}.lock"), create=False)
    except FileNotFoundError:
        return False  # no lock file: no owner (or the journal is going)
    except OSError:
        return True
    lock.close()
    return False


def _take_journal_lock(lock_path: Path, journal: Path, *, existing: bool) -> BinaryIO:
    """One of a journal's locks (see :func:`_take_lock`); with ``existing``, only while
    the journal is there: a lock file made for a journal deleted meanwhile goes again,
    as its owner's would, before the flock is let go."""
    lock = _take_lock(lock_path, create=not existing or journal.exists())
    if existing and not journal.exists():
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()
        lock.close()
        raise FileNotFoundError(journal)
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
            if path.is_file():
                path = _upgrade(path)
            journal = Journal(path, existing=True)
        except OSError:
            continue  # its process is alive, or another process adopted it first
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


def _upgrade(legacy: Path) -> Path:
    """The journal a process of an earlier version left (one SQLite file), copied into a
    journal of segments beside it, then deleted; ``OSError`` when its process still runs.

    A crash half way leaves both, and the events are written twice: harmless, as any
    batch written again.
    """
    lock_path = Path(f"{legacy}.lock")
    lock = _take_lock(lock_path, create=True)
    try:
        if not legacy.is_file():
            # Emptied and deleted by its owner: the lock file goes as an owner's does.
            lock_path.unlink()
            raise FileNotFoundError(legacy)
        upgraded = legacy.with_name(f"{legacy.name[: -len(SUFFIX)]}-upgraded{SUFFIX}")
        with contextlib.closing(sqlite3.connect(f"file:{legacy}?mode=ro", uri=True)) as db:
            meta = db.execute("SELECT value FROM meta WHERE name = 'database'").fetchone()
            events = db.execute("SELECT kind, payload FROM events ORDER BY seq").fetchall()
            aside = db.execute(
                "SELECT kind, payload, reason, at FROM set_aside ORDER BY seq"
            ).fetchall()
        journal = Journal(upgraded, None if meta is None else str(meta[0]))
        try:
            for kind, payload, reason, at in aside:
                journal.append(str(kind), str(payload))
                [entry] = journal.peek(1, float("inf"))  # the one event in line
                journal.set_aside(entry, str(reason), float(at))
            for kind, payload in events:
                journal.append(str(kind), str(payload))
        finally:
            journal.close(delete_if_empty=False)
        for leftover in (legacy, Path(f"{legacy}-wal"), Path(f"{legacy}-shm")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()
    except sqlite3.Error as exc:
        raise OSError(f"journal {legacy} of an earlier version cannot be read: {exc}") from exc
    finally:
        lock.close()
    return upgraded


# --- other processes' journals, read without their locks ------------------------------


def _waiting_events(path: Path) -> Iterator[tuple[str, str]]:
    """``(kind, payload)`` of each event waiting in a journal, restored ones last.

    What has left may still be read here until the owner's checkpoint says so: an
    event counts as waiting a moment longer, never less."""
    checkpoint = _Checkpoint.read(path)
    aside = _read_set_aside(path)
    skip = _Spans(checkpoint.removed)
    tail = JournalTail(path, checkpoint.low)
    try:
        while batch := tail.read(4096):
            for seq, kind, payload in batch:
                if seq not in skip and seq not in aside:
                    yield kind, payload
    finally:
        tail.close()
    for entry in aside.values():
        if entry.restored:
            yield entry.kind, entry.payload


def journal_depth(root: Path, *, only: str = "*", table: str = "events") -> int:
    """Events waiting in every journal under ``root`` (or its database folder ``only``).

    ``table="set_aside"`` counts the events set aside instead.
    """
    if table not in ("events", "set_aside"):
        raise ValueError("table is 'events' or 'set_aside'")
    total = 0
    if not root.is_dir():
        return 0
    for path in root.glob(f"{only}/*{SUFFIX}"):
        try:
            if table == "set_aside":
                total += sum(1 for a in _read_set_aside(path).values() if not a.restored)
            else:
                total += sum(1 for _ in _waiting_events(path))
        except OSError:
            continue  # being deleted right now, or not a journal
    return total


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
            # Set-aside events count too: an attempt whose outcome is known on this
            # machine but could not be written is not lost, and its task must not be
            # sent again.
            payloads = [p for _, p in _waiting_events(path)]
            payloads += [a.payload for a in _read_set_aside(path).values() if not a.restored]
        except OSError:
            continue  # being deleted right now: its events are in SQL
        for payload in payloads:
            step_id = _step_id(payload)
            if step_id in wanted:
                found.add(step_id)
    return found


def _step_id(payload: str) -> str | None:
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    step_id = data.get("step_id") if isinstance(data, dict) else None
    return step_id if isinstance(step_id, str) else None
