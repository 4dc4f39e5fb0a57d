"""A journal's due events written to SQL in batches, and the poison split.

Each batch is at most ``batch_size`` events, planned by ``apply`` and written
in one transaction; its events leave the journal only after COMMIT returned.
A batch that fails for any reason but an outage holds an event that can never
be applied (a poison event): the batch is split in halves, each written on its
own, until that event is alone and set aside, so the events around it land.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from pikku_celery.errors import StoreConflict
from pikku_celery.mirror.apply import Pending, plan
from pikku_celery.mirror.deferral import Deferral
from pikku_celery.mirror.events import ResultStored, decode
from pikku_celery.mirror.journal import Journal, JournalEntry
from pikku_celery.mirror.outage import Outage, an_outage
from pikku_celery.store import FiredChord, WorkflowStore

__all__ = ["BATCH_SIZE", "BatchWriter", "ChordsFired", "Committed"]

logger = logging.getLogger(__name__)

#: Called with the durable-workflow runs whose step ended, once that is committed.
Committed = Callable[[Sequence[str]], None]
#: Called with the chords whose bodies are to be sent, once the batch that claimed them
#: committed (the result backend's native chords).
ChordsFired = Callable[[Sequence[FiredChord]], None]

BATCH_SIZE: Final = 500
_LAG_SAMPLES: Final = 100_000


class BatchWriter:
    """Writes journals to the store, one batch at a time (one journal at a time, too).

    ``own_journal``: this process's journal, the only one whose catching up ends an
    outage; ``committed``: told of the runs to replay after a batch commits. Counts
    what it wrote (``written``, ``batches``) and each event's lag to its COMMIT.
    """

    def __init__(
        self,
        store: Callable[[], WorkflowStore],
        *,
        batch_size: int,
        deferral: Deferral,
        outage: Outage,
        own_journal: Callable[[], Journal | None],
        committed: Committed,
        fired: ChordsFired,
    ) -> None:
        self._store = store
        self.batch_size = batch_size
        self._deferral = deferral
        self._outage = outage
        self._own_journal = own_journal
        self._committed = committed
        self._fired = fired
        self._lock = threading.Lock()
        # Per journal, the steps with events deferred in it: a result of such a step waits
        # behind them, so it is never in SQL before the attempt it belongs to.
        self._held: dict[str, set[str]] = {}
        self.written = self.batches = 0
        self.lags: deque[float] = deque(maxlen=_LAG_SAMPLES)

    def flush_journal(self, journal: Journal) -> bool:
        """Write a journal's due events in batches; False when the database is away."""
        with self._lock:
            while True:
                entries = journal.peek(self.batch_size, time.time())
                if not entries:
                    self._caught_up(journal)
                    return True
                try:
                    self._write(journal, entries)
                except Exception as exc:
                    if not an_outage(exc):
                        raise
                    if isinstance(exc, StoreConflict):
                        # Another batch held what this one needed: nothing is away, so
                        # the batch goes again at the next flush, with no backoff.
                        logger.info(
                            "pikku-celery writes a batch again: %s",
                            exc,
                            extra={"action": "mirror_batch_conflict"},
                        )
                        return True
                    self._outage.began(journal, exc)
                    return False
                self._outage.wrote(len(entries))
                if len(entries) < self.batch_size:
                    self._caught_up(journal)
                    return True

    def _caught_up(self, journal: Journal) -> None:
        if journal is self._own_journal():
            self._outage.caught_up()

    def _write(self, journal: Journal, entries: Sequence[JournalEntry]) -> None:
        now = time.time()
        grace = self._deferral.grace
        pending: list[Pending] = []
        for entry in entries:
            try:
                event = decode(entry.kind, entry.payload)
            except ValueError as exc:
                self._deferral.put_aside(journal, entry, f"not a mirror event: {exc}")
                continue
            waited = entry.deferred_since is not None and now - entry.deferred_since > grace
            pending.append(Pending(entry.seq, event, waited))
        by_seq = {e.seq: e for e in entries}
        behind = self._behind_their_step(journal, pending)
        if behind:
            self._deferral.defer(journal, behind, by_seq, now)
            pending = [p for p in pending if p not in behind]
        self._write_pending(journal, pending, by_seq)

    def _behind_their_step(self, journal: Journal, pending: Sequence[Pending]) -> list[Pending]:
        """Results whose step has an earlier event deferred in this journal, not in this
        batch: they wait for it (journal order is the attempt's, then its result)."""
        held = self._held.get(str(journal.path))
        if not held:
            return []
        present = {p.event.step_id for p in pending if not isinstance(p.event, ResultStored)}
        return [
            p
            for p in pending
            if isinstance(p.event, ResultStored)
            and p.event.step_id in held
            and p.event.step_id not in present
        ]

    def _write_pending(
        self, journal: Journal, pending: Sequence[Pending], entries: Mapping[int, JournalEntry]
    ) -> None:
        if not pending:
            return
        store = self._store()
        try:
            result = store.batches.apply_batch(plan(pending))
        except Exception as exc:
            if an_outage(exc):
                raise
            if len(pending) > 1:  # a poison event: split until it is alone
                half = len(pending) // 2
                self._write_pending(journal, pending[:half], entries)
                self._write_pending(journal, pending[half:], entries)
                return
            self._deferral.put_aside(journal, entries[pending[0].seq], _reason(exc))
            return
        committed = time.time()
        waiting = [p for p in pending if p.event.step_id in result.missing]
        done = [p for p in pending if p.event.step_id not in result.missing]
        journal.remove(p.seq for p in done)
        self._deferral.defer(journal, waiting, entries, committed)
        held = self._held.setdefault(str(journal.path), set())
        held.difference_update(p.event.step_id for p in done)
        held.update(p.event.step_id for p in waiting)
        self.written += len(done)
        self.batches += 1
        self.lags.extend(committed - p.event.at for p in done)
        if result.replay:
            self._committed(result.replay)
        if result.fired:
            self._fired(result.fired)


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
