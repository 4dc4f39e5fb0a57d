"""The sinks of a prefork worker node: the main process writes, its pool processes append.

A worker's main process serves its node (``Recorder.serve_node``, before its
pool starts): its sink, :class:`NodeSink`, writes its own journal and those of
the processes it forks, in shared batches (``mirror/node.py`` finds and
claims them). Those processes' sink, :class:`AppendOnlySink`, only appends:
a task's events cost a ``write`` each, not a thread and a database
connection per pool process. A ready result a reader waits for is written at
once: the pool process writes one byte to the node's wake pipe.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Sequence

from pikku_celery.mirror.events import MirrorEvent, encode_bytes
from pikku_celery.mirror.forks import keep_inherited
from pikku_celery.mirror.journal import Journal
from pikku_celery.mirror.node import NodeJournals
from pikku_celery.mirror.sink import AfterCommit, EventSink, Place, SinkSettings, SinkStats, awaited
from pikku_celery.mirror.sinks.hosted import publisher_sink
from pikku_celery.mirror.sinks.own import OwnSink

__all__ = ["AppendOnlySink", "NodeSink"]


class NodeSink(OwnSink):
    """A worker's main process: its journal and its pool processes' journals, written by
    its flusher (which looks at theirs every interval: no wake tells of their appends).
    ``settings.background`` False: no thread, :meth:`flush` writes."""

    def __init__(self, place: Place, settings: SinkSettings, after: AfterCommit) -> None:
        self._node = NodeJournals(
            place.folder,
            place.database,
            self.journal,
            self._forget,
            retry_after=settings.adopt_interval,
        )
        super().__init__(place, settings, after)
        self._node_lock = threading.Lock()  # one pass over the node's journals at a time
        read, self._wake_pipe = os.pipe()
        os.set_blocking(self._wake_pipe, False)
        threading.Thread(
            target=self._hear_node, args=(read,), name="pikku-celery-node", daemon=True
        ).start()

    def _forget(self, journal: Journal) -> None:
        self._batches.forget(journal)

    def _hear_node(self, read: int) -> None:
        while os.read(read, 4096):
            self._flusher.wake(at_once=True)

    def _polls(self) -> bool:
        return True

    def _journals(self) -> list[Journal]:
        return [*super()._journals(), *self._node.refresh()]

    def _write(self, journals: Sequence[Journal]) -> bool:
        with self._node_lock:
            ok = super()._write(journals)
            if ok:
                # After every pass that went well, the flusher's or a caller's: the
                # journals of ended pool processes go once they are written.
                self._node.run_when_due()
            return ok

    def _opened(self) -> None:
        if self.settings.background:
            super()._opened()

    def _closing_journals(self, journal: Journal | None) -> list[Journal]:
        return [*super()._closing_journals(journal), *self._node.refresh()]

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        self.flush()  # a dead pool process's journal is most often claimed already
        return super().adopt_orphans(set_aside_too=set_aside_too)

    def _let_go(self) -> None:
        self._node.close()

    def forked(self) -> EventSink:
        self._inherited()
        keep_inherited(self._node)
        if os.getppid() != self._pid:
            # Forked by a process this one forked: not a pool process of this node.
            return publisher_sink(self.place, self.settings, self.after)
        return AppendOnlySink(self.place, self.settings, self.after, self._pid, self._wake_pipe)


class AppendOnlySink:
    """A pool process of a node: its events are appended to its journal, which the node's
    main process writes; a ready result wakes that process's flusher at once."""

    def __init__(
        self,
        place: Place,
        settings: SinkSettings,
        after: AfterCommit,
        node: int,
        wake: int,
    ) -> None:
        self.place, self.settings, self.after = place, settings, after
        self._node, self._wake = node, wake
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._journal: Journal | None = None
        self._appended = 0

    def append(self, event: MirrorEvent) -> None:
        journal = self._journal or self._open()
        journal.append(event.kind, encode_bytes(event))
        self._appended += 1
        if awaited(event):
            try:
                os.write(self._wake, b"!")
            except OSError:
                pass  # full: the flusher is woken already

    def _open(self) -> Journal:
        with self._lock:
            if self._journal is None:
                self._journal = Journal.for_process(
                    self.place.folder, self, self.place.database, role="append", node=self._node
                )
                atexit.register(self.close)  # lets its journal go; the node's flusher writes it
            return self._journal

    def start(self) -> None:
        self._open()

    def flush(self) -> bool:
        return True  # the node's flusher writes what this process appends

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        return 0  # the node's flusher adopts them

    def depth(self) -> int:
        journal = self._journal
        return 0 if journal is None else journal.depth()

    def stats(self) -> SinkStats:
        return SinkStats(self._appended, 0, 0, 0, [])

    def close(self, timeout: float = 10.0) -> None:
        if os.getpid() != self._pid:
            return
        with self._lock:
            journal, self._journal = self._journal, None
        if journal is not None:
            journal.close()  # the node's flusher writes it, and deletes it once empty
            atexit.unregister(self.close)

    def forked(self) -> EventSink:
        if self._journal is not None:
            keep_inherited(self._journal)
        # A process a task forks is no pool process: a publisher of its own.
        return publisher_sink(self.place, self.settings, self.after)
