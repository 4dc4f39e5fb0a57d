"""The mirror's pipeline: typed events, the local journal, the sinks and apply. No Celery here.

Whatever source of events drives it (the Celery adapters of ``integration``, the
workflow engine), the path is the same: :class:`Recorder` turns what was seen
into a typed event (``events``) and hands it to this process's sink (``sink``,
``sinks``: one per process role, chosen once). The journaling sinks append it
to this process's journal (``journal``), the durability point, and a flusher
writes what the journals hold to SQL in group commits, as the store batches
``apply`` makes of the events. Everything below that is the store's.

Other layers import what ``__all__`` lists from here.
"""

from __future__ import annotations

from pikku_celery.mirror.events import (
    MirrorEvent,
    ResultStored,
    chord_applied,
    chord_extended,
    chord_sent,
    result_stored,
)
from pikku_celery.mirror.flusher import ENV_FLUSH_INTERVAL, FLUSH_INTERVAL
from pikku_celery.mirror.forks import process_id
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
    unserved_journals,
)
from pikku_celery.mirror.recorder import Recorder
from pikku_celery.mirror.sink import (
    AfterCommit,
    ChordsFired,
    Committed,
    EventSink,
    PublisherJournal,
    SinkStats,
)
from pikku_celery.mirror.sinks import DirectSink
from pikku_celery.mirror.values import PublishedStep, unserialisable

__all__ = [
    "ENV_FLUSH_INTERVAL",
    "ENV_JOURNAL_DIR",
    "FLUSH_INTERVAL",
    "SUFFIX",
    "AfterCommit",
    "ChordsFired",
    "Committed",
    "DirectSink",
    "EventSink",
    "Journal",
    "JournalEntry",
    "MirrorEvent",
    "PublishedStep",
    "PublisherJournal",
    "Recorder",
    "ResultStored",
    "SinkStats",
    "chord_applied",
    "chord_extended",
    "chord_sent",
    "database_folder",
    "default_journal_dir",
    "journal_depth",
    "journal_folder",
    "journaled_steps",
    "orphaned_journals",
    "probe_folder",
    "process_id",
    "result_stored",
    "unserialisable",
    "unserved_journals",
]
