"""A journal's set-aside file: events that can never be written, kept out of the way of
the events behind them, one JSON line each for a person to read.

An event set aside stays until the cause is fixed and it is put back in line
(``restored``); it then leaves as any other event does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pikku_celery.mirror.journal.files import write_atomically

__all__ = ["Aside", "read_set_aside", "write_set_aside"]

_SET_ASIDE: Final = "set-aside.jsonl"


@dataclass(slots=True)
class Aside:
    """An event set aside (``restored``: put back in line, not written yet)."""

    seq: int
    kind: str
    payload: str
    reason: str
    at: float
    restored: bool = False


def read_set_aside(path: Path) -> dict[int, Aside]:
    aside: dict[int, Aside] = {}
    try:
        lines = (path / _SET_ASIDE).read_bytes().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return aside
    for line in lines:
        try:
            data = json.loads(line)
            entry = Aside(
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


def write_set_aside(path: Path, aside: Iterable[Aside]) -> None:
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
        write_atomically(path / _SET_ASIDE, ("\n".join(lines) + "\n").encode())
    else:
        with contextlib.suppress(FileNotFoundError):
            (path / _SET_ASIDE).unlink()
