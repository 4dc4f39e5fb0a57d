"""No ``fork()`` while a SQLite connection of this process is in use.

SQLite keeps the state of a process's file locks in memory, per file, shared by
all its connections. A child forked while a connection of its parent was inside
a transaction inherits that state without the locks themselves (POSIX locks are
not inherited): every connection the child opens to that file later believes
another connection of its own holds the write lock, and waits for it for ever
("database is locked"). A prefork worker forks its pool processes while its
main process writes the database (recovery, the reaper, adopted journals), so
this is not rare on the embedded default.

Every SQLite connection is therefore counted while it is checked out of its
pool, and a fork waits (a few seconds at most) until none is. The pool's own
checkout and checkin mark the spans, so a transaction never spans a fork.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Final

import sqlalchemy as sa

__all__ = ["gate_forks"]

logger = logging.getLogger(__name__)

# A fork from a thread that itself holds a connection would wait for itself: it goes
# ahead after this long, as it did before the gate (and says so).
_FORK_WAIT: Final = 5.0


class _ForkGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self._forking = False

    def enter(self) -> None:
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._busy += 1

    def leave(self) -> None:
        with self._cond:
            self._busy = max(0, self._busy - 1)
            self._cond.notify_all()

    def before_fork(self) -> None:
        self._cond.acquire()
        self._forking = True
        deadline = time.monotonic() + _FORK_WAIT
        while self._busy and (left := deadline - time.monotonic()) > 0:
            self._cond.wait(left)
        if self._busy:
            logger.warning(
                "pikku-celery forks while %d SQLite connection(s) of this process are in use; "
                "the child may find the database locked",
                self._busy,
                extra={"action": "sqlite_fork_busy"},
            )
        # Held through the fork: no connection is checked out meanwhile.

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        # The child has one thread and none of its parent's connections in use: a new
        # gate, since the old one's lock belongs to the parent's threads.
        global _GATE
        _GATE = _ForkGate()


_GATE = _ForkGate()
_REGISTERED = False
_REGISTER_LOCK = threading.Lock()


def _before() -> None:
    _GATE.before_fork()


def _parent() -> None:
    _GATE.after_fork_in_parent()


def _child() -> None:
    _GATE.after_fork_in_child()


def _checkout(*_: Any) -> None:
    _GATE.enter()


def _checkin(*_: Any) -> None:
    _GATE.leave()


def gate_forks(engine: sa.Engine) -> None:
    """Count ``engine``'s connections in use, and hold every fork until none is."""
    global _REGISTERED
    with _REGISTER_LOCK:
        if not _REGISTERED and hasattr(os, "register_at_fork"):
            os.register_at_fork(before=_before, after_in_parent=_parent, after_in_child=_child)
            _REGISTERED = True
    if not sa.event.contains(engine, "checkout", _checkout):
        sa.event.listen(engine, "checkout", _checkout)
        sa.event.listen(engine, "checkin", _checkin)
