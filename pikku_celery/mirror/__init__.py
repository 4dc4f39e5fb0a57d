"""The mirror's pipeline: typed events, the local journal, delivery and apply. No Celery here.

Whatever source of events drives it (the Celery adapters of ``integration``, the
workflow engine), the path is the same: :class:`CeleryMirror` turns what was seen
into a typed event (``events``) and appends it to this process's journal
(``journal``), which is the durability point; the flusher of ``delivery`` writes
what the journal holds to SQL in group commits, as the store batches ``apply``
makes of the events. Everything below that is the store's.

Other layers import what ``__all__`` lists from here.
"""

from __future__ import annotations

from pikku_celery.mirror.core import CeleryMirror, PublishedStep, unserialisable
from pikku_celery.mirror.delivery import (
    ENV_FLUSH_INTERVAL,
    FLUSH_INTERVAL,
    Committed,
    DeliveryStats,
)
from pikku_celery.mirror.journal import (
    ENV_JOURNAL_DIR,
    SUFFIX,
    Journal,
    JournalEntry,
    database_folder,
    default_journal_dir,
    journal_depth,
    journal_folder,
    journaled_steps,
    orphaned_journals,
    probe_folder,
)

__all__ = [
    "ENV_FLUSH_INTERVAL",
    "ENV_JOURNAL_DIR",
    "FLUSH_INTERVAL",
    "SUFFIX",
    "CeleryMirror",
    "Committed",
    "DeliveryStats",
    "Journal",
    "JournalEntry",
    "PublishedStep",
    "database_folder",
    "default_journal_dir",
    "journal_depth",
    "journal_folder",
    "journaled_steps",
    "orphaned_journals",
    "probe_folder",
    "unserialisable",
]
