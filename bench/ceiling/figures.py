"""A measured interval turned into per-task figures and the ceiling they imply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from bench.ceiling.server import Reading

__all__ = ["SECONDS_A_DAY", "Figures", "figures"]

SECONDS_A_DAY: Final = 86_400


@dataclass(frozen=True)
class Figures:
    tasks: int
    seconds: float
    #: PostgreSQL CPU ms per task, the bench's own reading connection left out.
    cpu_ms: float
    commits: float
    wal_bytes: float
    notifies: float
    #: Bytes kept per task, by table.
    table_bytes: Mapping[str, float]

    @property
    def rate(self) -> float:
        """Tasks a second over the interval (on this machine, with its load)."""
        return self.tasks / self.seconds

    @property
    def per_core(self) -> float:
        """Tasks a second one PostgreSQL core keeps up with, were CPU the only limit."""
        return 1000 / self.cpu_ms if self.cpu_ms > 0 else float("inf")

    def cores(self, count: int) -> float:
        """``per_core`` times ``count``: a linear extrapolation, nothing measured."""
        return self.per_core * count

    @property
    def kept_bytes(self) -> float:
        return sum(self.table_bytes.values())

    def kept_a_day(self, tasks_a_second: float) -> float:
        """Bytes of rows and indexes a day of ``tasks_a_second`` leaves, before any prune."""
        return self.kept_bytes * tasks_a_second * SECONDS_A_DAY


def figures(before: Reading, after: Reading, tasks: int, seconds: float) -> Figures:
    """Per-task figures of ``tasks`` tasks done between ``before`` and ``after``."""
    if tasks < 1:
        raise ValueError(f"an interval of {tasks} tasks has no per-task figures")
    server = after.server_cpu - before.server_cpu
    reader = after.reader_cpu - before.reader_cpu
    tables = sorted(set(before.sizes) | set(after.sizes))
    grown = {name: after.sizes.get(name, 0) - before.sizes.get(name, 0) for name in tables}
    return Figures(
        tasks=tasks,
        seconds=seconds,
        cpu_ms=max(0.0, server - reader) * 1000 / tasks,
        commits=(after.next_xid - before.next_xid) / tasks,
        wal_bytes=(after.wal_bytes - before.wal_bytes) / tasks,
        notifies=(after.notifies - before.notifies) / tasks,
        table_bytes={name: grown[name] / tasks for name in tables if grown[name]},
    )
