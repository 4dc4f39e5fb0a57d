"""Events that cannot be written yet wait in the journal; those that never can are set aside.

An event whose step is not in SQL yet (its publish is journaled by another
process, most often one flush away) is deferred in place and tried again, at
every flush for a second, then less often. One that waited past its ``grace``,
or that is not a mirror event at all, or that a batch can never apply (a
poison event), is set aside in its journal file: logged with its ``action``
(``mirror_event_set_aside``), kept for ``pikku-celery journal --replay``, and
never in the way of the events behind it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Final

from pikku_celery.mirror.apply import Pending
from pikku_celery.mirror.journal import Journal, JournalEntry

__all__ = ["GRACE", "RETRY_FIRST", "RETRY_MOST", "Deferral"]

logger = logging.getLogger(__name__)

# How long an event waits for the event that must come first from another
# process (a step's publish) before the step is recorded without it.
GRACE: Final = 60.0
# Seconds before a deferred event (or, for the flusher, a batch after an outage) is tried
# again: the first time, and at most.
RETRY_FIRST: Final = 0.02
RETRY_MOST: Final = 2.0


class Deferral:
    """Defers the events of a batch that wait for another process's, and sets aside those
    that can never be written; counts the latter (``set_aside``)."""

    def __init__(self, *, flush_interval: float, grace: float) -> None:
        self.flush_interval = flush_interval
        self.grace = grace
        self.set_aside = 0

    def defer(
        self,
        journal: Journal,
        waiting: Sequence[Pending],
        entries: Mapping[int, JournalEntry],
        now: float,
    ) -> set[int]:
        """Try ``waiting`` (events whose step was not in SQL) again later; set aside those
        that had waited past their grace already, whose seqs it returns."""
        again: list[int] = []
        aside: set[int] = set()
        for item in waiting:
            entry = entries[item.seq]
            if item.overdue:
                aside.add(item.seq)
                # Even recorded on its own it found no step (or no run) to belong to.
                self.put_aside(
                    journal,
                    entry,
                    f"step {item.event.step_id} (or its run) was never recorded in "
                    f"{self.grace:.0f}s; nothing published it through pikku-celery",
                )
            else:
                again.append(item.seq)
        if again:
            # What they wait for is most often one flush away in another process:
            # try again at every flush for a second, then back off.
            since = min(entries[s].deferred_since or now for s in again)
            waited = now - since
            soon = max(self.flush_interval, RETRY_FIRST)  # never "now": that would spin
            delay = soon if waited < 1.0 else min(waited, RETRY_MOST)
            journal.defer(again, now + delay, now)
        return aside

    def put_aside(self, journal: Journal, entry: JournalEntry, reason: str) -> None:
        """Keep an event that can never be written out of the way, and say so."""
        journal.set_aside(entry, reason, time.time())
        self.set_aside += 1
        logger.error(
            "pikku-celery set aside a %s event it cannot write (%s); it is kept in %s. "
            "Fix the cause, then `pikku-celery journal --replay` writes it",
            entry.kind,
            reason,
            journal.path,
            extra={"action": "mirror_event_set_aside", "event": entry.kind, "seq": entry.seq},
        )
