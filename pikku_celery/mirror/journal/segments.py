"""A journal's segment files, and :class:`JournalTail`, the reader of their records.

A journal is a folder of append-only segments, each named after the seq of its first
record, so that a consumed segment can be deleted whole and any process can read the
journal while it grows, without a lock.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Final

from pikku_celery.mirror.journal.records import encode_record, parse_record

__all__ = ["JournalTail", "create_segment", "segment_firsts", "segment_name"]

# Each segment starts with this, then a header record (its first seq, the database).
_MAGIC: Final = b"PKJSEG1\n"
_SEGMENT_SUFFIX: Final = ".seg"
_HEADER_KIND: Final = "segment"
_CHUNK: Final = 256 * 1024
_HEADER_READ: Final = 64 * 1024


def segment_name(first: int) -> str:
    return f"{first:020d}{_SEGMENT_SUFFIX}"


def segment_firsts(path: Path) -> list[int]:
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


def create_segment(path: Path, first: int, database: str | None) -> tuple[int, int]:
    """A new segment of the journal at ``path`` starting at ``first``, its header written:
    the descriptor to append to and the header's size."""
    segment = path / segment_name(first)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
    try:
        fd = os.open(segment, flags, 0o644)
    except FileExistsError:
        # Made by an owner that died before its first record there: it holds none.
        segment.unlink()
        fd = os.open(segment, flags, 0o644)
    header = json.dumps({"first": first, "database": database})
    data = _MAGIC + encode_record(_HEADER_KIND, header)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, f"journal segment {segment}: header cut short")
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            segment.unlink()
        raise
    return fd, len(data)


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
        firsts = segment_firsts(self.path)
        if self._fd is None:
            below = [first for first in firsts if first <= self._seq]
            return below[-1] if below else (firsts[0] if firsts else None)
        later = [first for first in firsts if first > self._first]
        return later[0] if later else None

    def _open(self, first: int) -> None:
        try:
            fd = os.open(self.path / segment_name(first), os.O_RDONLY)
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
                parsed = parse_record(buffer, pos)
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
        parsed = parse_record(head, len(_MAGIC))
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
