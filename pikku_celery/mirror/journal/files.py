"""The small files beside a journal's segments (its meta, the checkpoint log when it is
rewritten, the set-aside file): each written whole, so that a reader sees the old
contents or the new, never a mix.

Nothing is synced, as for the segments: these files outlive the death of their writer,
not a crash of the machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_json", "write_atomically"]


def write_atomically(path: Path, data: bytes) -> None:
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


def read_json(path: Path) -> Any:
    """The file's JSON; None when it is missing or unreadable (a crash of the machine can
    leave a file renamed but empty, and what it said is only an optimisation)."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
