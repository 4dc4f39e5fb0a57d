"""Delivery of mirror events: the journal first, then group commits to SQL.

A signal handler appends its event to this process's journal and returns:
that append is the durability point. A flusher thread per process writes
what the journal holds at most once every ``flush_interval`` seconds (a full
batch is followed by the next at once), one transaction per batch, and
removes the events only after COMMIT returned. A database that cannot be reached only makes the
journal longer; the log says when that started (``mirror_spooling``) and
when it caught up (``mirror_caught_up``).

The same thread adopts journals of processes that are gone (a killed pool
child, a publisher that exited) every ``adopt_interval`` seconds. After a
fork, the child starts with no journal and no thread of its own: its
parent's stay the parent's. A worker's main process serves its node
(:meth:`Delivery.serve_node`): the pool processes it forks then only append,
and its flusher writes their journals with its own in shared batches
(``node``).

Each of those jobs is a module of its own, which :class:`Delivery` puts
together: ``flusher`` (the thread and its pace), ``batches`` (batches and the
poison split), ``deferral`` (events that wait, events set aside),
``orphans`` (adoption), ``node`` (a node's journals), ``ledger`` (pruning the
counted deliveries) and ``outage`` (what the log says while the database is
away).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pikku_celery.errors import StoreError
from pikku_celery.mirror.batches import BATCH_SIZE, BatchWriter, ChordsFired, Committed
from pikku_celery.mirror.deferral import GRACE, Deferral
from pikku_celery.mirror.events import MirrorEvent, ResultStored, encode
from pikku_celery.mirror.flusher import ENV_FLUSH_INTERVAL, FLUSH_INTERVAL, Flusher
from pikku_celery.mirror.forks import ForkGuard, keep_inherited
from pikku_celery.mirror.journal import Journal, Role
from pikku_celery.mirror.ledger import Ledger
from pikku_celery.mirror.node import NodeJournals
from pikku_celery.mirror.orphans import ADOPT_INTERVAL, Orphans
from pikku_celery.mirror.outage import Outage
from pikku_celery.store import FiredChord, WorkflowStore

__all__ = [
    "ADOPT_INTERVAL",
    "BATCH_SIZE",
    "ENV_FLUSH_INTERVAL",
    "FLUSH_INTERVAL",
    "GRACE",
    "ChordsFired",
    "Committed",
    "Delivery",
    "DeliveryStats",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeliveryStats:
    """What this process's delivery did; ``lags``: seconds from event to COMMIT."""

    appended: int
    written: int
    batches: int
    set_aside: int
    lags: list[float]


# Celery's ready states: what AsyncResult.get() waits for.
_READY: Final = frozenset({"SUCCESS", "FAILURE", "REVOKED"})


def _awaited(event: MirrorEvent) -> bool:
    """Whether a reader waits for this event's batch (``AsyncResult.get()`` for a ready
    result; the task's own end was journaled before it), so that after an idle spell it
    is written at once. A publish never is: a canvas's run must not be written with only
    some of its steps, and a STARTED or progress state has nobody waiting on it."""
    return isinstance(event, ResultStored) and event.state in _READY


class Delivery:
    """Takes a mirror's events from the journal of this process to the store.

    ``store``, ``folder`` and ``database`` are asked each time (the mirror may
    be redirected, and a forked child makes its own connections); the settings
    are fixed when it is made. ``background=False``: no flusher thread, the
    owner calls :meth:`flush` itself.
    """

    def __init__(
        self,
        store: Callable[[], WorkflowStore],
        folder: Callable[[], Path],
        database: Callable[[], str],
        *,
        flush_interval: float = FLUSH_INTERVAL,
        batch_size: int = BATCH_SIZE,
        adopt_interval: float = ADOPT_INTERVAL,
        grace: float = GRACE,
        background: bool = True,
    ) -> None:
        self._store = store
        self.background = background
        self._folder = folder
        self._database = database
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self.adopt_interval = adopt_interval
        self.grace = grace
        self._listeners: list[Committed] = []
        self._fired_listeners: list[ChordsFired] = []
        self._fork = ForkGuard(self._after_fork)
        # The process serving its node (see serve_node): set in it, inherited by its children.
        self._node_pid: int | None = None
        # Written by a pool process when a reader waits for its event (a ready result): the
        # node's flusher, which otherwise looks every interval, then writes it at once.
        self._node_wake: int | None = None
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._journal: Journal | None = None
        # A pool process of a served node: it appends, its parent writes.
        self.append_only = self._node_pid not in (None, os.getpid()) and (
            self._node_pid == os.getppid()
        )
        self._node: NodeJournals | None = None
        self._node_lock = threading.Lock()  # one pass over the node's journals at a time
        self._appended = 0
        outage = Outage()
        self._deferral = Deferral(flush_interval=self.flush_interval, grace=self.grace)
        self._batches = BatchWriter(
            self._store,
            batch_size=self.batch_size,
            deferral=self._deferral,
            outage=outage,
            own_journal=lambda: self._journal,
            committed=self._committed,
            fired=self._chords_fired,
        )
        self._orphans = Orphans(
            self._folder,
            self._database,
            self._batches.flush_journal,
            adopt_interval=self.adopt_interval,
        )
        self._flusher = Flusher(
            self._journals,
            self._flush_journals,
            poll=lambda: self._node is not None,
            outage=outage,
            orphans=self._orphans,
            ledger=Ledger(self._store),
            flush_interval=self.flush_interval,
            adopt_interval=self.adopt_interval,
        )

    def serve_node(self) -> None:
        """From now on, the processes this one forks only append to their journals, and
        this one's flusher writes them (a worker's main process, before its pool starts)."""
        self._this_process()
        with self._lock:
            self._node_pid = os.getpid()
            if self._node_wake is None:
                read, self._node_wake = os.pipe()
                os.set_blocking(self._node_wake, False)
                threading.Thread(
                    target=self._hear_node, args=(read,), name="pikku-celery-node", daemon=True
                ).start()
            if self._node is None:
                self._node = NodeJournals(
                    self._folder,
                    self._database,
                    lambda: self._journal,
                    self._batches.forget,
                    retry_after=self.adopt_interval,
                )

    def _hear_node(self, read: int) -> None:
        while os.read(read, 4096):
            self._flusher.wake(at_once=True)

    def _journals(self) -> list[Journal] | None:
        """This process's journal, then its node's (None: it has none, the flusher ends)."""
        journal = self._journal
        return None if journal is None else self._with_node(journal)

    def _with_node(self, journal: Journal | None) -> list[Journal]:
        """``journal`` (this process's, if it has one), then the node's it serves."""
        journals = [] if journal is None else [journal]
        node = self._node
        return journals if node is None else [*journals, *node.refresh()]

    def _flush_journals(self, journals: Sequence[Journal]) -> bool:
        with self._node_lock:
            ok = self._batches.flush_journals(journals)
            if ok and self._node is not None:
                self._node.sweep_when_due()
            return ok

    def _after_fork(self) -> None:
        if self._journal is not None:
            keep_inherited(self._journal)
        self._reset()

    def _this_process(self) -> None:
        self._fork.check()

    def on_committed(self, listener: Committed) -> None:
        """Call ``listener`` from the flusher thread after a batch that ended workflow steps."""
        self._listeners.append(listener)

    def on_chords_fired(self, listener: ChordsFired) -> None:
        """Call ``listener`` from the flusher thread after a batch that completed chords."""
        self._fired_listeners.append(listener)

    def _chords_fired(self, chords: Sequence[FiredChord]) -> None:
        for listener in self._fired_listeners:
            try:
                listener(chords)
            except Exception:
                logger.exception(
                    "pikku-celery could not send the bodies of chords %s",
                    ", ".join(c.group_id for c in chords),
                    extra={"action": "chord_fire_failed"},
                )

    def _committed(self, runs: Sequence[str]) -> None:
        for listener in self._listeners:
            try:
                listener(runs)
            except Exception:
                logger.exception(
                    "pikku-celery could not replay workflow runs %s after their step ended",
                    ", ".join(runs),
                    extra={"action": "replay_after_commit_failed"},
                )

    def twin(
        self,
        store: Callable[[], WorkflowStore],
        folder: Callable[[], Path],
        database: Callable[[], str],
        *,
        background: bool,
    ) -> Delivery:
        """A delivery with this one's settings and listeners, for another store and folder."""
        twin = Delivery(
            store,
            folder,
            database,
            flush_interval=self.flush_interval,
            batch_size=self.batch_size,
            adopt_interval=self.adopt_interval,
            grace=self.grace,
            background=background,
        )
        twin._listeners = self._listeners  # the same list: a listener added later hears both
        twin._fired_listeners = self._fired_listeners
        return twin

    # --- the hot path -------------------------------------------------------------

    def append(self, event: MirrorEvent) -> None:
        """Journal the event (durable when this returns); the flusher writes it to SQL."""
        self._this_process()
        journal = self._journal or self._open()
        journal.append(event.kind, encode(event))
        self._appended += 1
        if not self.append_only:
            self._flusher.wake(at_once=_awaited(event))
        elif self._node_wake is not None and _awaited(event):
            with contextlib.suppress(OSError):  # full: the flusher is woken already
                os.write(self._node_wake, b"!")

    def _open(self) -> Journal:
        with self._lock:
            if self._journal is None:
                role: Role = "append" if self.append_only else "own"
                self._journal = Journal.for_process(
                    self._folder(),
                    self,
                    self._database(),
                    role=role,
                    node=self._node_pid if self.append_only else None,
                )
                self._start()
            return self._journal

    def start(self) -> None:
        """Run the flusher now (a worker's main process: to adopt journals of dead children)."""
        self._this_process()
        self._open()

    def _start(self) -> None:
        if self.append_only:
            atexit.register(self.close)  # lets its journal go; the node's flusher writes it
            return
        if not self.background:
            return  # the owner calls flush() itself
        if self._flusher.start():
            atexit.register(self.close)

    # --- writing ----------------------------------------------------------------------

    def flush(self) -> bool:
        """Write every event that is due now; False when the database is away."""
        self._this_process()
        if self.append_only:
            return True  # the node's flusher writes what this process appends
        journals = self._with_node(self._journal)
        return self._flush_journals(journals) if journals else True

    def flush_journal(self, journal: Journal) -> bool:
        """Write a journal's due events in batches; False when the database is away."""
        return self._batches.flush_journal(journal)

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        """Write the journals left by processes that are gone; returns how many events.

        ``set_aside_too``: first put back the events they set aside (once their cause
        is fixed), so they are tried again.
        """
        if self._node is not None:
            self.flush()  # a dead pool process's journal is most often claimed already
        return self._orphans.adopt(set_aside_too=set_aside_too)

    # --- the end ----------------------------------------------------------------------

    def depth(self) -> int:
        """Events of this process that wait for SQL."""
        self._this_process()
        journal = self._journal
        return 0 if journal is None else journal.depth()

    def stats(self) -> DeliveryStats:
        batches = self._batches
        return DeliveryStats(
            self._appended,
            batches.written,
            batches.batches,
            self._deferral.set_aside,
            list(batches.lags),
        )

    def close(self, timeout: float = 10.0) -> None:
        """Write what is due now; what is left stays in the journal for adoption.

        Events deferred for another process's (a step's publish that is not in SQL
        yet) are not waited for: the next flusher that adopts the journal writes
        them, so a worker stops as fast as one without the mirror. ``timeout``
        bounds the wait for the flusher thread's batch in flight.
        """
        if self._fork.forked:
            return  # a forked child leaves its parent's journal alone
        with self._lock:
            journal, self._journal = self._journal, None
            thread = self._flusher.halt()
        self._flusher.join(thread, timeout)
        node = self._node
        if self.append_only or (journal is None and node is None):
            if journal is not None:
                journal.close()  # the node's flusher writes it, and deletes it once empty
                atexit.unregister(self.close)
            return
        try:
            self._flush_journals(self._with_node(journal))
        except StoreError:
            pass  # the database is away: the journal keeps the events
        if node is not None:
            node.close()
        if journal is not None:
            journal.close()
        atexit.unregister(self.close)
