"""Events that could not be journaled (a full or read-only disk): counted, and logged once
a minute, not once per event of a busy worker."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Final

from pikku_celery.mirror.events import MirrorEvent
from pikku_celery.mirror.journal import ENV_JOURNAL_DIR

__all__ = ["LostEvents"]

logger = logging.getLogger(__name__)

# Seconds between two log lines about events that could not be journaled.
_FAILURE_LOG_EVERY: Final = 60.0


class LostEvents:
    """How many events this process could not journal (``count``)."""

    def __init__(self) -> None:
        self.count = 0
        self._logged_at = -_FAILURE_LOG_EVERY

    def lost(self, event: MirrorEvent, exc: Exception, folder: Path) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._logged_at < _FAILURE_LOG_EVERY:
            return
        self._logged_at = now
        logger.error(
            "pikku-celery could not journal %s for task %s (%d events lost in this "
            "process so far): %s; free the disk of %s or point %s elsewhere",
            event.kind,
            event.step_id,
            self.count,
            exc,
            folder,
            ENV_JOURNAL_DIR,
            extra={
                "action": "mirror_write_failed",
                "event": event.kind,
                "task_id": event.step_id,
                "count": self.count,
            },
        )
