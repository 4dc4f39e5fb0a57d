"""A journal's two lock files, so that one process at a time appends to a journal and
one at a time writes it to SQL, and a journal whose owner is gone can be told apart.

A process holds an exclusive ``flock`` on its journal's lock file while it lives,
so a journal whose lock can be taken belongs to a process that is gone (stopped,
recycled, killed): any other process may adopt it, write its events and delete it.
Whoever writes a journal to SQL holds a second lock, ``<journal>.consumer``: the
owner itself, or, for a worker's pool process that only appends, the worker's main
process; an adopter needs both locks, so it never takes a journal from under its
consumer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "consumer_alive",
    "consumer_lock",
    "owner_alive",
    "owner_lock",
    "take_journal_lock",
    "take_lock",
]


def owner_lock(journal: Path) -> Path:
    """Held by the process that appends to the journal, for as long as it lives."""
    return Path(f"{journal}.lock")


def consumer_lock(journal: Path) -> Path:
    """Beside the owner's lock: held by the process that writes the journal to SQL."""
    return Path(f"{journal}.consumer")


def take_lock(path: Path, *, create: bool) -> BinaryIO:
    """The journal's lock file, held with an exclusive ``flock`` (``OSError``: taken).

    A lock file is deleted by the owner of an emptied journal while it still holds
    the flock. Whoever opened it before that and takes the flock after holds a lock
    on a file no longer at the path, which a third could then make again and lock
    too: two adopters of one journal, each deleting it under the other, corrupt it.
    So the flock counts only while the path still names the file locked, and an
    adopter (``create=False``) never makes a lock file again.
    """
    flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
    # Held open: the flock lives as long as the file object does.
    lock = os.fdopen(os.open(path, flags, 0o644), "a+b")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            same = os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            raise FileNotFoundError(path)
    except OSError:
        lock.close()
        raise
    return lock


def take_journal_lock(lock_path: Path, journal: Path, *, existing: bool) -> BinaryIO:
    """One of a journal's locks (see :func:`take_lock`); with ``existing``, only while
    the journal is there: a lock file made for a journal deleted meanwhile goes again,
    as its owner's would, before the flock is let go."""
    lock = take_lock(lock_path, create=not existing or journal.exists())
    if existing and not journal.exists():
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()
        lock.close()
        raise FileNotFoundError(journal)
    return lock


def _held(lock_path: Path) -> bool:
    try:
        lock = take_lock(lock_path, create=False)
    except FileNotFoundError:
        return False  # no lock file: nobody holds it (or the journal is going)
    except OSError:
        return True
    lock.close()
    return False


def owner_alive(path: Path) -> bool:
    """Whether a process holds the journal's owner lock; nothing of the journal is read."""
    return _held(owner_lock(path))


def consumer_alive(path: Path) -> bool:
    """Whether a process holds the journal's consumer lock (writes it to SQL). The lock is
    taken for an instant if free: a consumer that tries just then finds it taken and
    tries again later, as for any journal it could not claim."""
    return _held(consumer_lock(path))
