"""Which database a journal's events are for: a journal is only ever written into its
own database, so whoever opens it must know, even before its first segment exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from pikku_celery.mirror.journal.files import read_json, write_atomically
from pikku_celery.mirror.journal.segments import JournalTail, segment_firsts

__all__ = ["read_database", "write_database"]

_META: Final = "meta.json"


def read_database(path: Path) -> str | None:
    """The database a journal is for: its meta file, else its first segment's header
    (the same key, written with the records themselves)."""
    meta = read_json(path / _META)
    if isinstance(meta, dict) and isinstance(meta.get("database"), str):
        return str(meta["database"])
    for first in segment_firsts(path):
        tail = JournalTail(path, first)
        try:
            tail.read(1)
            if tail.database is not None:
                return tail.database
        finally:
            tail.close()
    return None


def write_database(path: Path, database: str) -> None:
    write_atomically(path / _META, json.dumps({"database": database}).encode())
