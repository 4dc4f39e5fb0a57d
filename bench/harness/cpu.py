"""CPU seconds by process, read from ``/proc``: what each side of a benchmark cost.

Rates on a shared machine move with other people's load; CPU spent per task
by the bench's own processes does much less, so the benches report both.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Final

__all__ = ["PARTS", "cpu_delta", "cpu_snapshot"]

#: The bench's own processes, then "other": the machine's busy time outside them.
PARTS: Final = ("this process", "worker main", "worker children", "postgres", "redis", "other")

# A client backend's title: "postgres: [cluster: ]user database host(port) activity".
_BACKEND_TITLE: Final = re.compile(r"^postgres: (?:\S+: )?\S+ (\S+) (?:\S+\(\d+\)|\[local\])")


def _processes() -> Iterator[tuple[int, str, int, int, int]]:
    """(pid, command, parent pid, user + system clock ticks, the same of its reaped
    children) of every process."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone since the listing
        command = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 2 :].split()
        own, reaped = int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])
        yield int(entry.name), command, int(rest[1]), own, reaped


def _serves_other_database(pid: int, databases: Collection[str]) -> bool:
    """A client backend of a database that is not the bench's (another user's load)."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, UnicodeDecodeError):
        return False
    match = _BACKEND_TITLE.match(title)
    return match is not None and match.group(1) not in databases


def cpu_snapshot(worker_pid: int | None, databases: Collection[str] = ()) -> dict[str, float]:
    """CPU seconds used so far, by part (see ``PARTS``); empty where there is no /proc.

    ``postgres`` is the backends of ``databases`` plus the server's own
    processes (WAL writer, checkpointer...), which work for every database
    alike; other databases' backends fall to "other". ``postgres exited`` (not
    one of ``PARTS``) is the CPU of backends that ended, whatever their database,
    as the postmaster that reaped them counts it: a client connecting for each
    read (Celery's SQLAlchemy backend outside a worker) leaves its backends' work
    only there.
    """
    if not Path("/proc/stat").exists():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    used: Counter[str] = Counter()
    processes = list(_processes())
    servers = {pid for pid, command, *_ in processes if command == "postgres"}
    for pid, command, parent, ticks, reaped in processes:
        if command == "postgres" and parent not in servers:
            used["postgres exited"] += reaped
        if pid == worker_pid:
            used["worker main"] += ticks
        elif parent == worker_pid:
            used["worker children"] += ticks
        elif command == "postgres" and not _serves_other_database(pid, databases):
            used["postgres"] += ticks
        elif command == "redis-server":
            used["redis"] += ticks
    snapshot = {name: value / tick for name, value in used.items()}
    times = os.times()
    snapshot["this process"] = times.user + times.system
    jiffies = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = jiffies[3] + jiffies[4]
    snapshot["machine busy"] = (sum(jiffies[:8]) - idle) / tick
    snapshot["machine total"] = sum(jiffies[:8]) / tick
    return snapshot


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds by part between two snapshots, with "other" the machine's remainder."""
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    if delta:
        known = sum(delta.get(name, 0.0) for name in PARTS if name != "other")
        delta["other"] = max(0.0, delta["machine busy"] - known)
    return delta
