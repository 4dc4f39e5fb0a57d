"""The ledger of counted deliveries, pruned now and then by the flusher.

A start counts as a delivery once per event id, however often its batch is
written; the store keeps the ids it counted for ``LEDGER_DAYS``, and this
prunes the older ones every ``_PRUNE_EVERY`` seconds.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Final

from pikku_celery.store import WorkflowStore

__all__ = ["LEDGER_DAYS", "Ledger"]

logger = logging.getLogger(__name__)

# Deliveries are counted by event id for this long: a journal written again later
# than that (a machine back after a day) could count its starts twice.
LEDGER_DAYS: Final = 1.0
_PRUNE_EVERY: Final = 600.0


class Ledger:
    """Prunes the store's ledger of counted deliveries when a pass is due (one of the
    flusher's chores)."""

    def __init__(self, store: WorkflowStore) -> None:
        self._store = store
        self._last_prune = time.monotonic()

    def run_when_due(self) -> None:
        if time.monotonic() - self._last_prune >= _PRUNE_EVERY:
            self._last_prune = time.monotonic()
            self.prune()

    def prune(self) -> None:
        """Forget deliveries counted more than ``LEDGER_DAYS`` ago."""
        before = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=LEDGER_DAYS)
        try:
            self._store.batches.prune_deliveries(before)
        except Exception:  # a later pass tries again; nothing depends on it now
            logger.warning(
                "pikku-celery could not prune its ledger of counted deliveries",
                exc_info=True,
                extra={"action": "ledger_prune_failed"},
            )
