"""A hosted publisher: it only appends to its journal, and a node's flusher on its machine
writes it.

A publisher (a web app) set to ``"node"`` (:data:`~pikku_celery.mirror.sink.PublisherJournal`)
pays the append and nothing else: no flusher thread, no database connection for the
mirror. Its journal's name ends with ``HOSTED_SUFFIX``, so the flusher of any node of its
database on this machine (a prefork worker's main process, ``pikku-celery flusher``)
claims it while it lives, as it claims its own pool processes', and writes it in its
batches.

Waiting is never losing: the journal stays on disk and whichever node starts later writes
it (any process adopts it once the publisher has ended). But a journal nobody writes is a
mistake of the deployment, so the sink looks now and then, as it appends, whether a
process consumes its journal. One that finds none for :func:`unserved_after` says so once
per spell (``journal_unserved``) and counts it (``SinkStats.unserved``); the dashboard's
``/metrics`` counts such journals on its machine.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

from pikku_celery.mirror.events import MirrorEvent, encode
from pikku_celery.mirror.forks import keep_inherited
from pikku_celery.mirror.journal import Journal, consumer_alive
from pikku_celery.mirror.sink import AfterCommit, EventSink, Place, SinkSettings, SinkStats
from pikku_celery.mirror.sinks.own import own_sink

__all__ = ["HostedSink", "publisher_sink", "unserved_after"]

logger = logging.getLogger(__name__)


def publisher_sink(place: Place, settings: SinkSettings, after: AfterCommit) -> EventSink:
    """A publisher's sink, as ``settings.publisher`` says (a recorder that writes when
    asked, ``background`` False, always writes its own)."""
    if settings.publisher == "node" and settings.background:
        return HostedSink(place, settings, after)
    return own_sink(place, settings, after)


def unserved_after(settings: SinkSettings) -> float:
    """Seconds a hosted journal may go without a consumer before its publisher says so.

    A node's flusher claims a new journal at its next pass (a flush interval), and one it
    could not claim (another process held its lock for an instant) within an adoption
    interval: twice that is no transient."""
    return max(2 * settings.adopt_interval, 10 * settings.flush_interval)


class _Watch:
    """Whether a process consumes the hosted journal, looked at once per ``every`` seconds."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.next_look = float("inf")  # from when the journal is opened
        self.found = 0  # looks that found no consumer
        self._warned = False

    def opened(self) -> None:
        self.next_look = time.monotonic() + self.every

    def look(self, journal: Journal, *, ending: bool = False) -> None:
        self.next_look = time.monotonic() + self.every
        if consumer_alive(journal.path):
            if self._warned:
                self._warned = False
                logger.info(
                    "pikku-celery: journal %s is written by a node's flusher again",
                    journal.path,
                    extra={"action": "journal_served"},
                )
            return
        self.found += 1
        if self._warned:
            return
        self._warned = True
        logger.warning(
            "pikku-celery: no process writes this publisher's journal %s to SQL "
            '(pikku_publisher_journal is "node")%s; its events wait there, none is lost. '
            "Start a Celery worker (prefork) of this app on this machine, or run "
            "`pikku-celery flusher --app proj:pikku` (your app) beside this process, or set "
            'pikku_publisher_journal (PIKKU_PUBLISHER_JOURNAL) back to "own".',
            journal.path,
            ", and this process ends" if ending else f" for {self.every:g} s",
            extra={"action": "journal_unserved", "journal": str(journal.path)},
        )


class HostedSink:
    """A hosted publisher's journal: appended here, written by a node's flusher."""

    def __init__(self, place: Place, settings: SinkSettings, after: AfterCommit) -> None:
        self.place, self.settings, self.after = place, settings, after
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._journal: Journal | None = None
        self._appended = 0
        self._watch = _Watch(unserved_after(settings))

    def journal(self) -> Journal | None:
        """This process's journal; None until its first event."""
        return self._journal

    def append(self, event: MirrorEvent) -> None:
        journal = self._journal or self._open()
        journal.append(event.kind, encode(event))
        self._appended += 1
        if time.monotonic() >= self._watch.next_look:
            self._watch.look(journal)

    def _open(self) -> Journal:
        with self._lock:
            if self._journal is None:
                self._journal = Journal.for_process(
                    self.place.folder, self, self.place.database, role="append", hosted=True
                )
                self._watch.opened()
                atexit.register(self.close)  # lets it go: a node's flusher writes the rest
            return self._journal

    def start(self) -> None:
        self._open()

    def flush(self) -> bool:
        return True  # a node's flusher writes what this process appends

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        return 0  # a node's flusher adopts them

    def depth(self) -> int:
        journal = self._journal
        return 0 if journal is None else journal.depth()

    def stats(self) -> SinkStats:
        return SinkStats(self._appended, 0, 0, 0, [], unserved=self._watch.found)

    def close(self, timeout: float = 10.0) -> None:
        if os.getpid() != self._pid:
            return
        with self._lock:
            journal, self._journal = self._journal, None
        if journal is None:
            return
        # What nobody consumed stays for the next node or process that adopts it.
        self._watch.look(journal, ending=True)
        journal.close()
        atexit.unregister(self.close)

    def forked(self) -> EventSink:
        if self._journal is not None:
            keep_inherited(self._journal)
        # A forked web worker (a preloaded app) appends to a hosted journal of its own.
        return HostedSink(self.place, self.settings, self.after)
