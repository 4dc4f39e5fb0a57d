"""Journals' due events written to SQL in batches, and the poison split.

A batch may hold the events of several journals (a worker node's pool
processes), each journal's in its order. Each batch is at most ``batch_size``
events, planned by ``apply`` and written in one transaction; its events leave
their journals only after COMMIT returned. A batch that fails for any reason
but an outage holds an event that can never be applied (a poison event): the
batch is split in halves, each written on its own, until that event is alone
and set aside, so the events around it land.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from pikku_celery.errors import StoreConflict
from pikku_celery.faults import crash_point
from pikku_celery.mirror.apply import Pending, plan
from pikku_celery.mirror.deferral import Deferral
from pikku_celery.mirror.events import AttemptEnded, AttemptSucceeded, MirrorEvent, decode
from pikku_celery.mirror.journal import Journal, JournalEntry
from pikku_celery.mirror.ordering import Holds, overdue, waits_for_its_step
from pikku_celery.mirror.outage import Outage, an_outage
from pikku_celery.store import BatchResult, FiredChord, PartlyWritten, WorkflowStore

__all__ = ["BATCH_SIZE", "BatchWriter", "ChordsFired", "Committed"]

logger = logging.getLogger(__name__)

#: Called with the durable-workflow runs whose step ended, once that is committed.
Committed = Callable[[Sequence[str]], None]
#: Called with the chords whose bodies are to be sent, once the batch that claimed them
#: committed (the result backend's native chords).
ChordsFired = Callable[[Sequence[FiredChord]], None]

BATCH_SIZE: Final = 500
_ENDS: Final = (AttemptSucceeded, AttemptEnded)
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
        # What waits in each journal that holds any, for the events behind it there: what
        # this writer deferred in that journal, so kept as long as it holds the journal (a
        # left-over journal adopted again starts afresh, as in another process).
        self._holds: weakref.WeakKeyDictionary[Journal, Holds] = weakref.WeakKeyDictionary()
        self.written = self.batches = 0
        self.lags: deque[float] = deque(maxlen=_LAG_SAMPLES)

    def flush_journal(self, journal: Journal) -> bool:
        """Write a journal's due events in batches; False when the database is away."""
        return self.flush_journals((journal,))

    def flush_journals(self, journals: Sequence[Journal]) -> bool:
        """Write the due events of every journal in shared batches (each journal's in its
        order, the journals' merged by the time of their events); False when the database
        is away."""
        with self._lock:
            while True:
                now = time.time()
                peeked = [(journal, journal.peek(self.batch_size, now)) for journal in journals]
                total = sum(len(entries) for _, entries in peeked)
                if not total:
                    self._caught_up(journals)
                    return True
                try:
                    taken = self._write(peeked, now)
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
                    self._outage.began(next(j for j, e in peeked if e), exc)
                    return False
                self._outage.wrote(taken)
                if total < self.batch_size:
                    self._caught_up(journals)
                    return True

    def _caught_up(self, journals: Sequence[Journal]) -> None:
        if self._own_journal() in journals:
            self._outage.caught_up()

    def forget(self, journal: Journal) -> None:
        """A journal that is gone: nothing of it is held any more."""
        self._holds.pop(journal, None)

    def _write(self, peeked: Sequence[tuple[Journal, Sequence[JournalEntry]]], now: float) -> int:
        """Write one batch of what was peeked; returns how many events it took."""
        grace = self._deferral.grace
        lanes: list[list[_Item]] = []
        for journal, entries in peeked:
            lane: list[_Item] = []
            for entry in entries:
                try:
                    event = decode(entry.kind, entry.payload)
                except ValueError as exc:
                    self._deferral.put_aside(journal, entry, f"not a mirror event: {exc}")
                    continue
                late = overdue(entry.deferred_since, now, grace)
                lane.append(_Item(journal, entry, Pending(entry.seq, event, late)))
            if lane:
                lanes.append(lane)
        # One journal is one process's events in order; across processes, the order the
        # events happened in (a task retried in one pool process and run in another).
        items = (
            lanes[0][: self.batch_size]
            if len(lanes) == 1
            else list(itertools.islice(heapq.merge(*lanes, key=_when), self.batch_size))
        )
        self._write_in_order(items, now)
        return len(items)

    def _write_in_order(self, items: Sequence[_Item], now: float) -> None:
        """Write ``items`` but those that wait behind an earlier event of their journal."""
        behind = self._behind(items)
        if behind:
            for journal, lane in _by_journal(behind):
                self._defer(journal, lane, now)
            waiting = {id(i) for i in behind}
            items = [i for i in items if id(i) not in waiting]
        self._write_pending(items)

    def _behind(self, items: Sequence[_Item]) -> list[_Item]:
        """The events that wait behind an earlier one of their journal (see ``Holds``)."""
        if not self._holds:
            return []
        behind: list[_Item] = []
        for journal, lane in _by_journal(items):
            holds = self._holds.get(journal)
            if holds:
                behind.extend(holds.behind(lane))
        return behind

    def _write_pending(self, items: Sequence[_Item]) -> None:
        if not items:
            return
        store = self._store()
        if any(i.journal.external and isinstance(i.event, _ENDS) for i in items):
            # A node's flusher dies with another process's ended attempt in hand.
            crash_point("before_commit", "node")
        try:
            result = store.batches.apply_batch(plan([i.pending for i in items]))
        except Exception as exc:
            failure = exc
            if isinstance(exc, PartlyWritten):
                # Pieces of the batch committed before one failed: the chords they claimed
                # fire now (applied again, the batch claims them no more). Every event
                # stays in its journal, and the batch is applied again whole.
                self._acted_on(exc.written)
                failure = exc.cause
            if an_outage(failure):
                if failure is exc:
                    raise
                raise failure from failure.__cause__
            if len(items) > 1:  # a poison event: split until it is alone
                # Each half in order: what the first left waiting holds the second's back.
                half = len(items) // 2
                self._write_in_order(items[:half], time.time())
                self._write_in_order(items[half:], time.time())
                return
            self._deferral.put_aside(items[0].journal, items[0].entry, _reason(failure))
            self._left(items[0].journal, items)
            return
        committed = time.time()
        for journal, lane in _by_journal(items):
            waiting = [i for i in lane if waits_for_its_step(i.event, result.missing)]
            done = [i for i in lane if not waits_for_its_step(i.event, result.missing)]
            journal.remove(i.seq for i in done)
            self._left(journal, done)
            self._defer(journal, waiting, committed)
            self.written += len(done)
            self.lags.extend(committed - i.event.at for i in done)
        self.batches += 1
        self._acted_on(result)

    def _acted_on(self, result: BatchResult) -> None:
        """After COMMIT: the runs to replay, the chords to fire."""
        if result.replay:
            self._committed(result.replay)
        if result.fired:
            self._fired(result.fired)

    def _defer(self, journal: Journal, lane: Sequence[_Item], now: float) -> None:
        """These wait in their journal, and hold those behind them; the deferral sets aside
        those that waited past their grace, which hold nothing."""
        if not lane:
            return
        entries = {i.seq: i.entry for i in lane}
        aside = self._deferral.defer(journal, [i.pending for i in lane], entries, now)
        holds = self._holds.setdefault(journal, Holds())
        for item in lane:
            if item.seq in aside:
                holds.left(item)
            else:
                holds.deferred(item)
        if not holds:
            del self._holds[journal]

    def _left(self, journal: Journal, lane: Sequence[_Item]) -> None:
        """These left their journal (written or set aside): they hold nothing any more."""
        holds = self._holds.get(journal)
        if holds is None:
            return
        for item in lane:
            holds.left(item)
        if not holds:
            del self._holds[journal]


@dataclass(frozen=True, slots=True, eq=False)
class _Item:
    """An event of a batch, with the journal and the entry it came from."""

    journal: Journal
    entry: JournalEntry
    pending: Pending

    @property
    def seq(self) -> int:
        return self.pending.seq

    @property
    def event(self) -> MirrorEvent:
        return self.pending.event


def _when(item: _Item) -> float:
    return item.event.at


def _by_journal(items: Iterable[_Item]) -> list[tuple[Journal, list[_Item]]]:
    """The items of each journal, in their order there."""
    lanes: dict[Journal, list[_Item]] = {}
    for item in items:
        lanes.setdefault(item.journal, []).append(item)
    return list(lanes.items())


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
