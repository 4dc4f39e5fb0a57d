"""The CPU of a process's threads other than its main one, read from ``/proc``.

In a mirrored process those are mostly the mirror's flusher thread: in a
worker's main process it writes the whole node's journals, in a publisher its
own. Splitting them from the main thread shows how much of the mirror's cost
is the writing and how much the signal handlers on the task's own path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["SIDE_THREADS", "side_threads_cpu"]

#: The key the node bench adds to a ``cpu_snapshot`` for these seconds.
SIDE_THREADS: Final = "side threads"


def side_threads_cpu(pid: int) -> float:
    """User and system CPU seconds of ``pid``'s live threads but the main one (a thread that
    ended is counted only in the process's total)."""
    ticks = 0
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return 0.0
    for tid in tids:
        if tid == pid:
            continue
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # ended since the listing
        rest = text[text.rindex(")") + 2 :].split()
        ticks += int(rest[11]) + int(rest[12])
    return ticks / os.sysconf("SC_CLK_TCK")
