"""Whether the database is away, and what the log says about it.

An outage keeps every event in the journal; the log says so once when it starts
(``mirror_spooling``) and once when this process's journal has caught up
(``mirror_caught_up``), not once per flush. Tables that are missing or behind
this version (until ``pikku-celery db upgrade`` runs) are an outage too, said
again every minute (``mirror_schema_behind``): unlike a network blip, that
waits for a person.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from pikku_celery.errors import SchemaNotCurrent, Transient
from pikku_celery.mirror.journal import Journal

__all__ = ["Outage", "an_outage"]

logger = logging.getLogger(__name__)

# Seconds between two log lines about tables that are missing or behind.
_SCHEMA_LOG_EVERY: Final = 60.0


def an_outage(exc: BaseException) -> bool:
    """An error that keeps every event in the journal to be written later, never set aside:
    the database away, or its tables missing or behind (until ``db upgrade`` has run)."""
    return isinstance(exc, Transient | SchemaNotCurrent)


class Outage:
    """One process's view of an outage: since when, and how much was written since."""

    def __init__(self) -> None:
        self.since: float | None = None
        self._written = 0
        self._schema_logged_at = -_SCHEMA_LOG_EVERY

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def wrote(self, count: int) -> None:
        """``count`` events reached SQL: while an outage lasts, they are its catching up."""
        if self.since is not None:
            self._written += count

    def began(self, journal: Journal, exc: BaseException) -> None:
        """A batch of ``journal`` could not be written for ``exc``, an outage."""
        if isinstance(exc, SchemaNotCurrent):
            now = time.monotonic()
            if now - self._schema_logged_at >= _SCHEMA_LOG_EVERY:
                self._schema_logged_at = now
                logger.warning(
                    "pikku-celery keeps %d mirror events in %s: the workflow tables are "
                    "missing or behind this version; run `pikku-celery db upgrade` and they "
                    "are written within seconds",
                    journal.depth(),
                    journal.path,
                    extra={"action": "mirror_schema_behind", "journal": str(journal.path)},
                )
        if self.since is None:
            self.since = time.monotonic()
            self._written = 0
            if isinstance(exc, SchemaNotCurrent):
                return
            logger.warning(
                "pikku-celery cannot reach the workflow database (%s); keeping mirror events "
                "in %s until it is back",
                exc,
                journal.path,
                extra={"action": "mirror_spooling", "journal": str(journal.path)},
            )

    def caught_up(self) -> None:
        """This process's journal holds nothing due any more: the outage is over."""
        if self.since is None:
            return
        logger.warning(
            "pikku-celery caught up: %d mirror events written from the journal after %.1fs",
            self._written,
            time.monotonic() - self.since,
            extra={"action": "mirror_caught_up", "count": self._written},
        )
        self.since = None
