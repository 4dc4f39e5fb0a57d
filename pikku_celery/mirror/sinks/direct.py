"""The sink of a process with no journal: each event planned and applied at once.

A process that stores Celery results in the store without a mirror installed
(``backend="pikku://"`` in a process with no ``PikkuCelery``), and a state
stored outside any task, which no attempt's end precedes, need the write in
SQL when the call returns: each event is one batch of its own, in one
transaction, and the chords it completes (and the durable runs it ends) are
handed to the :class:`AfterCommit` listeners after COMMIT. An error is the
caller's: nothing is kept to write later.
"""

from __future__ import annotations

import threading

from pikku_celery.mirror.apply import Pending, plan
from pikku_celery.mirror.events import MirrorEvent
from pikku_celery.mirror.sink import AfterCommit, EventSink, SinkStats
from pikku_celery.store import BatchResult, PartlyWritten, WorkflowStore

__all__ = ["DirectSink"]


class DirectSink:
    """Writes each event to ``store`` when it is appended."""

    def __init__(self, store: WorkflowStore, after: AfterCommit) -> None:
        self.store, self.after = store, after
        self._lock = threading.Lock()
        self._written = 0

    def append(self, event: MirrorEvent) -> None:
        try:
            result = self.store.batches.apply_batch(plan([Pending(0, event)]))
        except PartlyWritten as partly:
            # What the pieces that committed claimed is acted on; the error is the caller's.
            self._acted_on(partly.written)
            raise partly.cause from partly.cause.__cause__
        with self._lock:
            self._written += 1
        self._acted_on(result)

    def _acted_on(self, result: BatchResult) -> None:
        if result.replay:
            self.after.committed(result.replay)
        if result.fired:
            self.after.chords_fired(result.fired)

    def flush(self) -> bool:
        return True  # nothing waits: every event was written when it came

    def start(self) -> None:
        """Nothing to start: no journal, no thread."""

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        return 0  # a process without a journal adopts none

    def depth(self) -> int:
        return 0

    def stats(self) -> SinkStats:
        return SinkStats(self._written, self._written, self._written, 0, [])

    def close(self, timeout: float = 10.0) -> None:
        """Nothing held: every event is in SQL already."""

    def forked(self) -> EventSink:
        return self  # the store makes its own connections after a fork
