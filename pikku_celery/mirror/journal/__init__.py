"""The mirror's local journal: every event is appended here before it goes to SQL.

One journal per process and mirror, in a folder per database (:mod:`.folders`): a
directory of append-only segment files (:mod:`.segments`). An append is one
``os.write`` of a length-prefixed, checksummed record (:mod:`.records`) to a
descriptor opened with ``O_APPEND``; once it returns, the kernel holds the record, so
it outlives the death of the process at any instant (not a crash of the machine:
nothing is synced). A record cut short or damaged ends its segment for every reader;
a new owner never appends after it, it starts a segment of its own. A record's seq is
its ordinal in the journal, so another process can read a journal while it grows
(:class:`JournalTail`) without any lock.

A process holds its journal's lock files while it lives (:mod:`.locks`), so a journal
whose locks can be taken belongs to a process that is gone, and any other process may
adopt it (:mod:`.discovery`), write its events and delete it.

An event leaves the journal only once the batch holding it has committed; what has
left is kept in memory and in a checkpoint log beside the segments (:mod:`.checkpoint`),
without a sync: a batch written twice changes nothing in SQL, so events read again after
a crash are harmless. A segment goes once every record in it has left. An event that
must wait (its step is not in SQL yet) is deferred in place; one that can never be
written is set aside in a file of its own (:mod:`.aside`) and never blocks the events
behind it. :class:`Journal` (:mod:`.core`) puts these together for one process.
"""

from __future__ import annotations

from pikku_celery.mirror.journal.core import Journal, JournalEntry, Role
from pikku_celery.mirror.journal.discovery import (
    journal_depth,
    journaled_steps,
    orphaned_journals,
    unserved_journals,
)
from pikku_celery.mirror.journal.folders import (
    ENV_JOURNAL_DIR,
    HOSTED_SUFFIX,
    SUFFIX,
    database_folder,
    default_journal_dir,
    journal_folder,
    node_suffix,
    probe_folder,
    writable_folder,
)
from pikku_celery.mirror.journal.locks import consumer_alive, owner_alive
from pikku_celery.mirror.journal.segments import JournalTail

__all__ = [
    "ENV_JOURNAL_DIR",
    "HOSTED_SUFFIX",
    "SUFFIX",
    "Journal",
    "JournalEntry",
    "JournalTail",
    "Role",
    "consumer_alive",
    "database_folder",
    "default_journal_dir",
    "journal_depth",
    "journal_folder",
    "journaled_steps",
    "node_suffix",
    "orphaned_journals",
    "owner_alive",
    "probe_folder",
    "unserved_journals",
    "writable_folder",
]
