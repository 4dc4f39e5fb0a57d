"""The pipeline's one fork guard: what a process made is its own, never its forked children's.

A pool child forked by a worker inherits what its parent made: the store's
connections, the journal's open segment and locks, the flusher's state
(not its thread, which a fork does not copy), the prefix of the event ids.
Used in the child they would act on the parent's: one socket for two
processes, one journal file, one sequence of ids. A :class:`ForkGuard`
notices a fork by the process id at first use in the child (however the
process was forked) and runs its owner's ``after_fork`` there, once, before
anything else; what the parent owned is then kept, never closed
(:func:`keep_inherited`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

__all__ = ["ForkGuard", "keep_inherited", "process_id"]

# Re-made in every child: a thread of the parent may have held it at the fork, and no
# thread of the child would ever release it.
_lock = threading.RLock()

# Inherited objects of a parent process, referenced for as long as the child lives:
# closing (or collecting) an SQLite connection or a lock inherited across fork would
# act on the parent's.
_INHERITED: list[object] = []


# This process's id, set again in every forked child: ``os.getpid`` is a system call, and a
# pool process checks its guards several times per event.
_pid = os.getpid()


def process_id() -> int:
    """``os.getpid()``, without the system call (kept by a fork hook)."""
    return _pid


def _after_fork_in_child() -> None:
    global _lock, _pid
    _lock = threading.RLock()
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def keep_inherited(thing: object) -> None:
    """Never close ``thing``, a parent's, in this child: keep it referenced for good."""
    _INHERITED.append(thing)


class ForkGuard:
    """Runs ``after_fork`` once in each process forked from the one that last checked it,
    before that process uses what its owner holds."""

    def __init__(self, after_fork: Callable[[], None]) -> None:
        self._after_fork = after_fork
        self._pid = os.getpid()

    @property
    def forked(self) -> bool:
        """True in a forked child that has not checked the guard yet: what the owner holds
        is still its parent's."""
        return _pid != self._pid

    def check(self) -> None:
        """In a forked child, the first time: ``after_fork``; else nothing."""
        if _pid != self._pid:
            with _lock:
                if os.getpid() != self._pid:
                    self._after_fork()
                    self._pid = os.getpid()
