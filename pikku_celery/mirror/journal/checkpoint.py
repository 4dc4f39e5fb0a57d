"""What has left a journal: its checkpoint, the log its consumer appends it to, and the
spans of seqs a reader skips.

An event leaves only once the batch holding it has committed. A checkpoint is one
record appended to ``consumed.log`` per change (a rename per batch cost more than the
rest of the batch's file work), the last whole record counting; the log is rewritten
whole past a size, and whenever a process starts writing it (its tail may be torn).
"""

from __future__ import annotations

import bisect
import errno
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pikku_celery.mirror.journal.files import write_atomically
from pikku_celery.mirror.journal.records import encode_record, parse_record

__all__ = ["Checkpoint", "CheckpointLog", "Spans"]

_CHECKPOINT: Final = "consumed.log"
_CHECKPOINT_KIND: Final = "checkpoint"
_CHECKPOINT_BYTES: Final = 256 * 1024


@dataclass(slots=True)
class Checkpoint:
    """What has left a journal: every seq below ``low``, and the spans ``removed``."""

    low: int = 1
    removed: tuple[tuple[int, int], ...] = ()
    deferred: tuple[tuple[int, float, float], ...] = ()

    @classmethod
    def read(cls, path: Path) -> Checkpoint:
        """The last whole checkpoint its consumer wrote (a torn last one is ignored)."""
        data = _last_checkpoint(path / _CHECKPOINT)
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
        return encode_record(_CHECKPOINT_KIND, json.dumps(data, separators=(",", ":")))


def _last_checkpoint(path: Path) -> Any:
    try:
        buffer = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    last: str | None = None
    pos = 0
    while True:
        parsed = parse_record(buffer, pos)
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


class CheckpointLog:
    """The consumer's side of a journal's checkpoint file: a record appended per change.

    A reader sees the old checkpoint or the new, never a mix: it takes the last record
    whose checksum holds. No sync, as for the segments.
    """

    def __init__(self, path: Path) -> None:
        self._path = path / _CHECKPOINT
        self._fd: int | None = None
        self._size = 0

    def write(self, checkpoint: Checkpoint) -> None:
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
        write_atomically(self._path, record)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._size = len(record)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Spans:
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
