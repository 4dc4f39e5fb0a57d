"""Journals of processes that are gone, adopted: written to SQL by a live process, then deleted.

A killed pool child or a publisher that exited leaves its journal behind, its
lock free. Every flusher looks for such journals of its database every
``adopt_interval`` seconds, writes them as it writes its own, and deletes
them once empty; a worker's main process therefore writes its dead children's
events within seconds. ``pikku-celery journal --replay`` does the same once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from pikku_celery.mirror.journal import Journal, orphaned_journals

__all__ = ["ADOPT_INTERVAL", "Orphans"]

logger = logging.getLogger(__name__)

ADOPT_INTERVAL: Final = 2.0

_LAST_LOOK: Final[dict[str, float]] = {}  # folder -> when a mirror of this process last looked


class Orphans:
    """Adopts the journals left in this database's folder by processes that are gone.

    ``flush_journal`` writes one journal as the flusher writes its own (False: the
    database is away). One of the flusher's chores (:meth:`run_when_due`).
    """

    def __init__(
        self,
        folder: Path,
        database: str,
        flush_journal: Callable[[Journal], bool],
        *,
        adopt_interval: float,
    ) -> None:
        self._folder = folder
        self._database = database
        self._flush_journal = flush_journal
        self.adopt_interval = adopt_interval
        self._last_adopt = 0.0
        # One adoption at a time in a process: a caller that must see what the journals
        # of dead processes hold waits for the one under way (a new one after a fork).
        self._adopting = threading.Lock()

    def run_when_due(self) -> None:
        if time.monotonic() - self._last_adopt < self.adopt_interval:
            return
        self._last_adopt = time.monotonic()
        # One look per folder and interval in a process, however many mirrors it
        # holds: each look tries the lock of every journal in the folder, so a
        # process with hundreds of mirrors on one database (an app made per test)
        # would otherwise spend its time locking its own journals.
        # (No lock: two threads that both look once in a while do no harm, and a lock
        # held at a fork would stay held in the child for good.)
        folder, now = str(self._folder), time.monotonic()
        last = _LAST_LOOK.get(folder)
        if last is not None and now - last < self.adopt_interval:
            return
        _LAST_LOOK[folder] = now
        self.adopt()

    def adopt(self, *, set_aside_too: bool = False) -> int:
        """Write the journals left by processes that are gone; returns how many events.

        ``set_aside_too``: first put back the events they set aside (once their cause
        is fixed), so they are tried again.
        """
        with self._adopting:
            return self._adopt(set_aside_too)

    def _adopt(self, set_aside_too: bool) -> int:
        written = 0
        try:
            for journal in orphaned_journals(self._folder, self._database):
                if set_aside_too:
                    journal.restore_set_aside()
                depth = journal.depth()
                ok = self._flush_journal(journal)
                left = journal.depth()
                written += depth - left
                journal.close()
                if depth:
                    logger.warning(
                        "pikku-celery wrote %d mirror events left in %s by a process that ended%s",
                        depth - left,
                        journal.path,
                        "" if ok else f"; {left} wait for the database",
                        extra={"action": "journal_adopted", "count": depth - left},
                    )
                if not ok:
                    break
        except Exception:
            logger.exception(
                "pikku-celery could not write a left-over journal",
                extra={"action": "journal_adopt_failed"},
            )
        return written
