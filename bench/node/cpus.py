"""Which CPU each side of the node bench runs on.

What is measured is how the mirror does when the worker has one CPU to itself
and everything it talks to runs elsewhere, as on a worker host of its own: the
worker (main process and pool processes) on ``WORKER_CPU``; PostgreSQL, Redis,
the publisher and the bench's own waiting on ``SERVER_CPU``. The servers are
pinned by process (every thread of every ``postgres`` and ``redis-server``
process; backends forked meanwhile inherit the postmaster's CPU) and always
given their CPUs back, since other work shares them.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

__all__ = [
    "SERVER_COMMANDS",
    "SERVER_CPU",
    "WORKER_CPU",
    "require_cpus",
    "servers_on",
    "this_thread_on",
    "tree_cpus",
]

WORKER_CPU: Final = 0
SERVER_CPU: Final = 1
SERVER_COMMANDS: Final = ("postgres", "redis-server")


def require_cpus() -> None:
    """Refuse to run where the two CPUs are not both there to pin to."""
    wanted = {WORKER_CPU, SERVER_CPU}
    if not wanted <= os.sched_getaffinity(0):
        raise SystemExit(
            f"the node bench pins to CPUs {sorted(wanted)}; this process may use only "
            f"{sorted(os.sched_getaffinity(0))}"
        )


def _command(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None  # gone since the listing


def _stat_parent(pid: str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[1])


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def server_pids() -> list[int]:
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and _command(entry) in SERVER_COMMANDS
    ]


def _pin(pid: int, cpus: Collection[int]) -> None:
    # sched_setaffinity takes a thread: Redis's background threads are pinned one by one.
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            pass  # ended meanwhile
        except PermissionError as error:
            raise SystemExit(
                f"cannot pin {SERVER_COMMANDS} process {pid}: {error}; run the node bench as "
                "root or as the servers' user"
            ) from error


@contextmanager
def servers_on(cpus: Collection[int]) -> Iterator[None]:
    """PostgreSQL and Redis on ``cpus`` meanwhile; afterwards on the CPUs they had (also
    the backends forked while they were pinned, which inherited ``cpus``)."""
    before: set[int] = set()
    for pid in server_pids():
        for tid in _threads(pid):
            try:
                before |= os.sched_getaffinity(tid)
            except ProcessLookupError:
                pass
    restore = before or os.sched_getaffinity(0)
    try:
        for pid in server_pids():
            _pin(pid, cpus)
        yield
    finally:
        for pid in server_pids():
            _pin(pid, restore)


@contextmanager
def this_thread_on(cpus: Collection[int]) -> Iterator[None]:
    """This thread on ``cpus`` meanwhile: what it forks (a worker, a publisher) inherits them."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def tree_cpus(pid: int) -> dict[int, set[int]]:
    """The CPUs of ``pid`` and of each of its children (a worker and its pool)."""
    found = {pid} | {
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and _stat_parent(entry) == pid
    }
    cpus: dict[int, set[int]] = {}
    for member in found:
        try:
            cpus[member] = os.sched_getaffinity(member)
        except ProcessLookupError:
            pass
    return cpus
