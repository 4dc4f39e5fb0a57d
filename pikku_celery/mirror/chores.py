"""The flusher's chores: work it does between batches, each when it is due.

Adopting the journals of processes that are gone (``orphans``), pruning the
ledger of counted deliveries (``ledger``) and letting go of a node's emptied
journals (``node``) share one shape: a flusher calls :meth:`Chore.run_when_due`
after every batch that went well, and the chore decides whether its time has
come. One that fails logs and waits for its next turn; it never stops the
flusher.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

__all__ = ["Chore", "run_chores"]

logger = logging.getLogger(__name__)


class Chore(Protocol):
    def run_when_due(self) -> None:
        """Do the chore if its interval has passed since the last time; cheap otherwise."""


def run_chores(chores: Sequence[Chore]) -> None:
    for chore in chores:
        try:
            chore.run_when_due()
        except Exception:
            logger.exception(
                "pikku-celery flusher chore %s failed; it runs again when next due",
                type(chore).__name__,
                extra={"action": "flusher_chore_failed"},
            )
