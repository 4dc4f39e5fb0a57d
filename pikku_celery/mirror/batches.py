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
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from pikku_celery.errors import StoreConflict
from pikku_celery.faults import crash_point
from pikku_celery.mirror.apply import Pending, plan
from pikku_celery.mirror.deferral import Deferral
from pikku_celery.mirror.events import (
    AttemptEnded,
    AttemptSucceeded,
    StepPublished,
    decode,
)
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
        # Per journal, the steps with events deferred in it: a result of such a step waits
        # behind them, so it is never in SQL before the attempt it belongs to.
        # (step id -> the seqs of its events that wait): its later events wait behind them.
        self._held: dict[str, dict[str, set[int]]] = {}
        # Per journal, the runs with a step whose publish is deferred in it (a chain's next
        # link, published by the pool process that ran the link before): a success of that
        # run's steps journaled after it waits behind it, or the run would complete without
        # the step. (run id -> step id -> the seq of its publish.)
        self._held_runs: dict[str, dict[str, dict[str, int]]] = {}
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
        self._held.pop(str(journal.path), None)
        self._held_runs.pop(str(journal.path), None)

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
                waited = entry.deferred_since is not None and now - entry.deferred_since > grace
                lane.append(_Item(journal, entry, Pending(entry.seq, event, waited)))
            if lane:
                lanes.append(lane)
        # One journal is one process's events in order; across processes, the order the
        # events happened in (a task retried in one pool process and run in another).
        items = (
            lanes[0][: self.batch_size]
            if len(lanes) == 1
            else list(itertools.islice(heapq.merge(*lanes, key=_when), self.batch_size))
        )
        behind = self._behind_their_step(items)
        if behind:
            for journal, lane in _by_journal(behind):
                self._deferral.defer(
                    journal, [i.pending for i in lane], {i.entry.seq: i.entry for i in lane}, now
                )
            for journal, lane in _by_journal(behind):
                # They wait now: what follows them in their step (or run) waits behind them.
                self._hold(journal, done=[], waiting=[i.pending for i in lane])
                self._publishes(journal, done=[], waiting=[i.pending for i in lane])
            waiting = {id(i) for i in behind}
            items = [i for i in items if id(i) not in waiting]
        self._write_pending(items)
        return len(items) + len(behind)

    def _behind_their_step(self, items: Sequence[_Item]) -> list[_Item]:
        """Events that wait for an earlier event of their journal, deferred and not written
        in this batch: any later event of the same step (a redelivery's start, the
        attempt's end, its result: one process's events of a step keep their order), and a
        step's success for a publish of its run (a chain's next link).

        What this batch writes is decided in order, so an event that waits holds back those
        behind it; and a success waits for the publish itself, not for any event of that
        step (the link's own start, due before its publish, waits too)."""
        if not any(self._held.values()) and not any(self._held_runs.values()):
            return []
        written: set[tuple[int, int]] = set()  # (journal, seq) this batch writes
        behind = []
        for item in items:
            event, path, lane = item.pending.event, str(item.journal.path), id(item.journal)
            held = self._held.get(path, {}).get(event.step_id)
            first = min(held) if held else None
            if first is not None and first < item.pending.seq and (lane, first) not in written:
                waits = True
            elif isinstance(event, AttemptSucceeded) and event.run_id is not None:
                publishes = self._held_runs.get(path, {}).get(event.run_id, {})
                waits = any(
                    seq < item.pending.seq and (lane, seq) not in written
                    for seq in publishes.values()
                )
            else:
                waits = False
            if waits:
                behind.append(item)
                continue
            written.add((lane, item.pending.seq))
        return behind

    def _write_pending(self, items: Sequence[_Item]) -> None:
        if not items:
            return
        store = self._store()
        if any(i.journal.external and isinstance(i.pending.event, _ENDS) for i in items):
            # A node's flusher dies with another process's ended attempt in hand.
            crash_point("before_commit", "node")
        try:
            result = store.batches.apply_batch(plan([i.pending for i in items]))
        except Exception as exc:
            if an_outage(exc):
                raise
            if len(items) > 1:  # a poison event: split until it is alone
                half = len(items) // 2
                self._write_pending(items[:half])
                self._write_pending(items[half:])
                return
            self._deferral.put_aside(items[0].journal, items[0].entry, _reason(exc))
            self._hold(items[0].journal, done=[items[0].pending], waiting=[])
            self._publishes(items[0].journal, done=[items[0].pending], waiting=[])
            return
        committed = time.time()
        for journal, lane in _by_journal(items):
            waiting = [i.pending for i in lane if i.pending.event.step_id in result.missing]
            done = [i.pending for i in lane if i.pending.event.step_id not in result.missing]
            journal.remove(p.seq for p in done)
            self._deferral.defer(journal, waiting, {i.entry.seq: i.entry for i in lane}, committed)
            self._hold(journal, done, waiting)
            self._publishes(journal, done, waiting)
            self.written += len(done)
            self.lags.extend(committed - p.event.at for p in done)
        self.batches += 1
        if result.replay:
            self._committed(result.replay)
        if result.fired:
            self._fired(result.fired)

    def _hold(self, journal: Journal, done: Sequence[Pending], waiting: Sequence[Pending]) -> None:
        """Keep, per step, the first of its events that waits in ``journal`` (``_held``)."""
        held = self._held.setdefault(str(journal.path), {})
        gone = {id(item) for item in done}
        for item in (*done, *waiting):
            seqs = held.setdefault(item.event.step_id, set())
            # One that waited past its grace is set aside by the deferral: it holds nothing.
            if id(item) in gone or item.overdue:
                seqs.discard(item.seq)
            else:
                seqs.add(item.seq)
            if not seqs:
                del held[item.event.step_id]

    def _publishes(
        self, journal: Journal, done: Sequence[Pending], waiting: Sequence[Pending]
    ) -> None:
        """Keep the runs with a publish deferred in ``journal`` (see ``_held_runs``)."""
        runs = self._held_runs.setdefault(str(journal.path), {})
        deferred = {id(item) for item in waiting}
        for item in (*done, *waiting):
            event = item.event
            if not isinstance(event, StepPublished):
                continue
            steps = runs.setdefault(event.run_id, {})
            # One that waited past its grace is set aside by the deferral: it holds nothing.
            if id(item) in deferred and not item.overdue:
                steps[event.step_id] = item.seq
            else:
                steps.pop(event.step_id, None)
            if not steps:
                del runs[event.run_id]


@dataclass(frozen=True, slots=True, eq=False)
class _Item:
    """An event of a batch, with the journal and the entry it came from."""

    journal: Journal
    entry: JournalEntry
    pending: Pending


def _when(item: _Item) -> float:
    return item.pending.event.at


def _by_journal(items: Iterable[_Item]) -> list[tuple[Journal, list[_Item]]]:
    lanes: dict[int, tuple[Journal, list[_Item]]] = {}
    for item in items:
        lanes.setdefault(id(item.journal), (item.journal, []))[1].append(item)
    return list(lanes.values())


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
