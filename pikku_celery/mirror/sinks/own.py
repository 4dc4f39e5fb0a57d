"""Sinks of a process that writes its own journal: with a flusher thread, or when asked.

:class:`OwnSink` is a publisher's (a web app, beat, a solo or threads worker):
every event is appended to this process's journal, and a flusher thread
writes it in the next group commit, adopting the journals of processes that
are gone between batches. :class:`InlineSink` is the same without the thread:
the owner writes with :meth:`InlineSink.flush` (tests, ``Recorder.redirected``,
``pikku-celery journal --replay``).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Sequence

from pikku_celery.errors import StoreError
from pikku_celery.mirror.batches import BatchWriter
from pikku_celery.mirror.chores import Chore
from pikku_celery.mirror.deferral import Deferral
from pikku_celery.mirror.events import MirrorEvent, encode
from pikku_celery.mirror.flusher import Flusher
from pikku_celery.mirror.forks import keep_inherited
from pikku_celery.mirror.journal import Journal
from pikku_celery.mirror.ledger import Ledger
from pikku_celery.mirror.orphans import Orphans
from pikku_celery.mirror.outage import Outage
from pikku_celery.mirror.sink import AfterCommit, EventSink, Place, SinkSettings, SinkStats, awaited

__all__ = ["InlineSink", "OwnSink", "own_sink"]


def own_sink(place: Place, settings: SinkSettings, after: AfterCommit) -> EventSink:
    """The sink of a process that writes its own journal, as ``settings`` say it does."""
    kind = OwnSink if settings.background else InlineSink
    return kind(place, settings, after)


class InlineSink:
    """This process's journal, written to SQL when :meth:`flush` is called."""

    def __init__(self, place: Place, settings: SinkSettings, after: AfterCommit) -> None:
        self.place, self.settings, self.after = place, settings, after
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._journal: Journal | None = None
        self._appended = 0
        self._outage = Outage()
        self._deferral = Deferral(flush_interval=settings.flush_interval, grace=settings.grace)
        self._batches = BatchWriter(
            place.current_store,
            batch_size=settings.batch_size,
            deferral=self._deferral,
            outage=self._outage,
            own_journal=self.journal,
            committed=after.committed,
            fired=after.chords_fired,
        )
        self._orphans = Orphans(
            place.folder,
            place.database,
            self._batches.flush_journal,
            adopt_interval=settings.adopt_interval,
        )

    def journal(self) -> Journal | None:
        """This process's journal; None until its first event."""
        return self._journal

    def append(self, event: MirrorEvent) -> None:
        journal = self._journal or self._open()
        journal.append(event.kind, encode(event))
        self._appended += 1
        self._appended_one(event)

    def _appended_one(self, event: MirrorEvent) -> None:
        """An event is in the journal (a flusher thread is woken)."""

    def _open(self) -> Journal:
        with self._lock:
            if self._journal is None:
                self._journal = Journal.for_process(
                    self.place.folder, self, self.place.database, role="own"
                )
                self._opened()
            return self._journal

    def _opened(self) -> None:
        """The journal was just opened, under the lock (a flusher thread starts)."""

    def start(self) -> None:
        self._open()

    def _journals(self) -> list[Journal]:
        """What a flush writes: this process's journal, if it has one."""
        journal = self._journal
        return [] if journal is None else [journal]

    def _write(self, journals: Sequence[Journal]) -> bool:
        return self._batches.flush_journals(journals)

    def flush(self) -> bool:
        journals = self._journals()
        return self._write(journals) if journals else True

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        return self._orphans.adopt(set_aside_too=set_aside_too)

    def depth(self) -> int:
        journal = self._journal
        return 0 if journal is None else journal.depth()

    def stats(self) -> SinkStats:
        batches = self._batches
        return SinkStats(
            self._appended,
            batches.written,
            batches.batches,
            self._deferral.set_aside,
            list(batches.lags),
        )

    def close(self, timeout: float = 10.0) -> None:
        if os.getpid() != self._pid:
            return  # a forked child (its atexit) leaves its parent's journal alone
        with self._lock:
            journal, self._journal = self._journal, None
        self._stopped(timeout)
        journals = self._closing_journals(journal)
        if journals:
            try:
                self._write(journals)
            except StoreError:
                pass  # the database is away: the journal keeps the events
        self._let_go()
        if journal is not None:
            journal.close()
        atexit.unregister(self.close)

    def _stopped(self, timeout: float) -> None:
        """A flusher thread has written its batch in flight and stopped."""

    def _closing_journals(self, journal: Journal | None) -> list[Journal]:
        return [] if journal is None else [journal]

    def _let_go(self) -> None:
        """The journals written for other processes are let go (a node's)."""

    def forked(self) -> EventSink:
        self._inherited()
        return type(self)(self.place, self.settings, self.after)

    def _inherited(self) -> None:
        """In a forked child: what this sink holds is its parent's, never closed here."""
        if self._journal is not None:
            keep_inherited(self._journal)


class OwnSink(InlineSink):
    """This process's journal, written by a flusher thread of its own: at most once every
    ``flush_interval`` (a ready result after an idle spell at once), journals of dead
    processes adopted between batches."""

    def __init__(self, place: Place, settings: SinkSettings, after: AfterCommit) -> None:
        super().__init__(place, settings, after)
        self._flusher = Flusher(
            self._flushed_journals,
            self._pass,
            poll=self._polls,
            outage=self._outage,
            chores=self._chores(),
            flush_interval=settings.flush_interval,
            adopt_interval=settings.adopt_interval,
        )

    def _pass(self, journals: Sequence[Journal]) -> int | None:
        """The flusher thread's pass: how many events it wrote; None: the database is away."""
        before = self._batches.written
        return self._batches.written - before if self._write(journals) else None

    def _chores(self) -> list[Chore]:
        return [self._orphans, Ledger(self.place.store)]

    def _polls(self) -> bool:
        """Other processes append to journals it writes, which no wake tells of."""
        return False

    def _flushed_journals(self) -> list[Journal] | None:
        """What the thread writes; None once this process's journal is closed (it ends)."""
        return None if self._journal is None else self._journals()

    def _appended_one(self, event: MirrorEvent) -> None:
        self._flusher.wake(at_once=awaited(event))

    def _opened(self) -> None:
        if self._flusher.start():
            atexit.register(self.close)

    def _stopped(self, timeout: float) -> None:
        with self._lock:
            thread = self._flusher.halt()
        self._flusher.join(thread, timeout)
