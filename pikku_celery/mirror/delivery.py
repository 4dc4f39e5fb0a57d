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
parent's stay the parent's.
"""

from __future__ import annotations

import atexit
import datetime as dt
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pikku_celery.errors import SchemaNotCurrent, StoreConflict, StoreError, Transient
from pikku_celery.mirror.apply import Pending, plan
from pikku_celery.mirror.events import MirrorEvent, decode, encode
from pikku_celery.mirror.journal import Journal, JournalEntry, orphaned_journals
from pikku_celery.store import WorkflowStore

__all__ = ["ENV_FLUSH_INTERVAL", "FLUSH_INTERVAL", "Delivery", "DeliveryStats"]

logger = logging.getLogger(__name__)

#: Called with the durable-workflow runs whose step ended, once that is committed.
Committed = Callable[[Sequence[str]], None]

# Chosen from bench.celery_bench on 2 cores: at 20 ms a prefork -c 2 worker made 0.40
# commits per no-op task (lag p99 110 ms), at 40 ms 0.13 (p99 about 100 ms); a batch costs
# about 1 ms of Python however small, so fewer, larger ones leave more CPU to the tasks.
FLUSH_INTERVAL: Final = 0.04
ENV_FLUSH_INTERVAL: Final = "PIKKU_FLUSH_INTERVAL"
BATCH_SIZE: Final = 500
ADOPT_INTERVAL: Final = 2.0
# How long an event waits for the event that must come first from another
# process (a step's publish) before the step is recorded without it.
GRACE: Final = 60.0
_RETRY_FIRST, _RETRY_MOST = 0.02, 2.0
# Seconds between two log lines about tables that are missing or behind.
_SCHEMA_LOG_EVERY: Final = 60.0
_LAG_SAMPLES: Final = 100_000
# Deliveries are counted by event id for this long: a journal written again later
# than that (a machine back after a day) could count its starts twice.
LEDGER_DAYS: Final = 1.0
_PRUNE_EVERY: Final = 600.0
# Journals of a parent process, kept referenced in its forked children: closing
# (or collecting) an SQLite connection or a lock inherited across fork would
# act on the parent's.
_INHERITED: list[object] = []


@dataclass(frozen=True, slots=True)
class DeliveryStats:
    """What this process's delivery did; ``lags``: seconds from event to COMMIT."""

    appended: int
    written: int
    batches: int
    set_aside: int
    lags: list[float]


class Delivery:
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
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()  # close(): the flusher stops waiting at once
        self._journal: Journal | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._appended = self._written = self._batches = self._set_aside = 0
        self._lags: deque[float] = deque(maxlen=_LAG_SAMPLES)
        self._outage_since: float | None = None
        self._schema_logged_at = -_SCHEMA_LOG_EVERY
        self._outage_written = 0
        self._last_adopt = 0.0
        self._last_prune = time.monotonic()

    def _this_process(self) -> None:
        if os.getpid() != self._pid:
            with self._lock:
                if os.getpid() != self._pid:
                    if self._journal is not None:
                        _INHERITED.append(self._journal)
                    self._reset()

    def on_committed(self, listener: Committed) -> None:
        """Call ``listener`` from the flusher thread after a batch that ended workflow steps."""
        self._listeners.append(listener)

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
        return twin

    # --- the hot path -------------------------------------------------------------

    def append(self, event: MirrorEvent) -> None:
        """Journal the event (durable when this returns); the flusher writes it to SQL."""
        self._this_process()
        journal = self._journal or self._open()
        journal.append(event.kind, encode(event))
        self._appended += 1
        if not self._wake.is_set():
            self._wake.set()

    def _open(self) -> Journal:
        with self._lock:
            if self._journal is None:
                self._journal = Journal.for_process(self._folder(), self, self._database())
                self._start()
            return self._journal

    def start(self) -> None:
        """Run the flusher now (a worker's main process: to adopt journals of dead children)."""
        self._this_process()
        self._open()

    def _start(self) -> None:
        if not self.background:
            return  # the owner calls flush() itself
        if self._thread is None or not self._thread.is_alive():
            self._closing = False
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="pikku-celery-flusher", daemon=True
            )
            self._thread.start()
            atexit.register(self.close)

    # --- the flusher ----------------------------------------------------------------

    def _run(self) -> None:
        delay = _RETRY_FIRST
        last = 0.0
        while not self._closing:
            journal = self._journal
            if journal is None:
                return
            self._wake.clear()  # before reading the journal: a later append wakes us
            due = journal.next_due()
            now = time.time()
            # Batches start at most once per interval (a longer one while the
            # database is away): that is what makes a commit serve many events.
            gap = last + (delay if self._outage_since is not None else self.flush_interval) - now
            if due is not None and due <= now:
                if gap > 0:
                    self._stop.wait(gap)
            else:
                timeout = (
                    self.adopt_interval if due is None else min(due - now, self.adopt_interval)
                )
                if self._wake.wait(timeout) and not self._closing:
                    # The first event of a group: let the others of this interval join it.
                    self._stop.wait(max(self.flush_interval, gap))
            if self._closing:
                return
            last = time.time()
            try:
                ok = self.flush_journal(journal)
            except Exception:  # never let the thread die: the journal stays on disk
                logger.exception(
                    "pikku-celery could not write its journal %s; it stays on disk",
                    journal.path,
                    extra={"action": "journal_flush_failed"},
                )
                ok = False
            delay = _RETRY_FIRST if ok else min(delay * 2, _RETRY_MOST)
            if ok and time.monotonic() - self._last_adopt >= self.adopt_interval:
                self._last_adopt = time.monotonic()
                self.adopt_orphans()
            if ok and time.monotonic() - self._last_prune >= _PRUNE_EVERY:
                self._last_prune = time.monotonic()
                self._prune_ledger()

    def _prune_ledger(self) -> None:
        before = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=LEDGER_DAYS)
        try:
            self._store().prune_deliveries(before)
        except Exception:  # a later pass tries again; nothing depends on it now
            logger.warning(
                "pikku-celery could not prune its ledger of counted deliveries",
                exc_info=True,
                extra={"action": "ledger_prune_failed"},
            )

    def flush(self) -> bool:
        """Write every event that is due now; False when the database is away."""
        self._this_process()
        journal = self._journal
        return True if journal is None else self.flush_journal(journal)

    def flush_journal(self, journal: Journal) -> bool:
        """Write a journal's due events in batches; False when the database is away."""
        with self._flush_lock:
            while True:
                entries = journal.peek(self.batch_size, time.time())
                if not entries:
                    self._caught_up(journal)
                    return True
                try:
                    self._write(journal, entries)
                except Exception as exc:
                    if not _an_outage(exc):
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
                    self._spooling(journal, exc)
                    return False
                if self._outage_since is not None:
                    self._outage_written += len(entries)
                if len(entries) < self.batch_size:
                    self._caught_up(journal)
                    return True

    def _write(self, journal: Journal, entries: Sequence[JournalEntry]) -> None:
        now = time.time()
        pending: list[Pending] = []
        for entry in entries:
            try:
                event = decode(entry.kind, entry.payload)
            except ValueError as exc:
                self._put_aside(journal, entry, f"not a mirror event: {exc}")
                continue
            waited = entry.deferred_since is not None and now - entry.deferred_since > self.grace
            pending.append(Pending(entry.seq, event, waited))
        self._write_pending(journal, pending, {e.seq: e for e in entries})

    def _write_pending(
        self, journal: Journal, pending: Sequence[Pending], entries: dict[int, JournalEntry]
    ) -> None:
        if not pending:
            return
        store = self._store()
        try:
            result = store.apply_batch(plan(pending))
        except Exception as exc:
            if _an_outage(exc):
                raise
            if len(pending) > 1:  # a poison event: split until it is alone
                half = len(pending) // 2
                self._write_pending(journal, pending[:half], entries)
                self._write_pending(journal, pending[half:], entries)
                return
            self._put_aside(journal, entries[pending[0].seq], _reason(exc))
            return
        committed = time.time()
        waiting = [p for p in pending if p.event.step_id in result.missing]
        done = [p for p in pending if p.event.step_id not in result.missing]
        journal.remove(p.seq for p in done)
        self._defer(journal, waiting, entries, committed)
        self._written += len(done)
        self._batches += 1
        self._lags.extend(committed - p.event.at for p in done)
        if result.replay:
            for listener in self._listeners:
                try:
                    listener(result.replay)
                except Exception:
                    logger.exception(
                        "pikku-celery could not replay workflow runs %s after their step ended",
                        ", ".join(result.replay),
                        extra={"action": "replay_after_commit_failed"},
                    )

    def _defer(
        self,
        journal: Journal,
        waiting: Sequence[Pending],
        entries: dict[int, JournalEntry],
        now: float,
    ) -> None:
        again: list[int] = []
        for item in waiting:
            entry = entries[item.seq]
            if item.overdue:
                # Even recorded on its own it found no step (or no run) to belong to.
                self._put_aside(
                    journal,
                    entry,
                    f"step {item.event.step_id} (or its run) was never recorded in "
                    f"{self.grace:.0f}s; nothing published it through pikku-celery",
                )
            else:
                again.append(item.seq)
        if again:
            # What they wait for is most often one flush away in another process:
            # try again at every flush for a second, then back off.
            since = min(entries[s].deferred_since or now for s in again)
            waited = now - since
            soon = max(self.flush_interval, _RETRY_FIRST)  # never "now": that would spin
            delay = soon if waited < 1.0 else min(waited, _RETRY_MOST)
            journal.defer(again, now + delay, now)

    def _put_aside(self, journal: Journal, entry: JournalEntry, reason: str) -> None:
        journal.set_aside(entry, reason, time.time())
        self._set_aside += 1
        logger.error(
            "pikku-celery set aside a %s event it cannot write (%s); it is kept in %s. "
            "Fix the cause, then `pikku-celery journal --replay` writes it",
            entry.kind,
            reason,
            journal.path,
            extra={"action": "mirror_event_set_aside", "event": entry.kind, "seq": entry.seq},
        )

    def _spooling(self, journal: Journal, exc: BaseException) -> None:
        if isinstance(exc, SchemaNotCurrent):
            # Said again every so often: unlike a network blip, this waits for a person.
            now = time.monotonic()
            if now - self._schema_logged_at >= _SCHEMA_LOG_EVERY:
                self._schema_logged_at = now
                logger.warning(
                    "pikku-celery keeps %d mirror events in %s: the workflow tables are "
                    "missing or behind this version; run `pikku-celery db upgrade` and they "
                    "are written within seconds",
                    journal.depth(),
                    journal.path,
                    extra={"action": "mirror_schema_behind", "journal": str(journal.path)},
                )
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self._outage_written = 0
            if isinstance(exc, SchemaNotCurrent):
                return
            logger.warning(
                "pikku-celery cannot reach the workflow database (%s); keeping mirror events "
                "in %s until it is back",
                exc,
                journal.path,
                extra={"action": "mirror_spooling", "journal": str(journal.path)},
            )

    def _caught_up(self, journal: Journal) -> None:
        if self._outage_since is None or journal is not self._journal:
            return
        logger.warning(
            "pikku-celery caught up: %d mirror events written from the journal after %.1fs",
            self._outage_written,
            time.monotonic() - self._outage_since,
            extra={"action": "mirror_caught_up", "count": self._outage_written},
        )
        self._outage_since = None

    # --- journals of processes that are gone ------------------------------------------

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        """Write the journals left by processes that are gone; returns how many events.

        ``set_aside_too``: first put back the events they set aside (once their cause
        is fixed), so they are tried again.
        """
        written = 0
        try:
            for journal in orphaned_journals(self._folder(), self._database()):
                if set_aside_too:
                    journal.restore_set_aside()
                depth = journal.depth()
                ok = self.flush_journal(journal)
                left = journal.depth()
                written += depth - left
                journal.close()
                if depth:
                    logger.warning(
                        "pikku-celery wrote %d mirror events left in %s by a process that ended%s",
                        depth - left,
                        journal.path,
                        "" if ok else f"; {left} wait for the database",
                        extra={"action": "journal_adopted", "count": depth - left},
                    )
                if not ok:
                    break
        except Exception:
            logger.exception(
                "pikku-celery could not write a left-over journal",
                extra={"action": "journal_adopt_failed"},
            )
        return written

    # --- the end ----------------------------------------------------------------------

    def depth(self) -> int:
        """Events of this process that wait for SQL."""
        self._this_process()
        journal = self._journal
        return 0 if journal is None else journal.depth()

    def stats(self) -> DeliveryStats:
        return DeliveryStats(
            self._appended, self._written, self._batches, self._set_aside, list(self._lags)
        )

    def close(self, timeout: float = 10.0) -> None:
        """Write what is due now; what is left stays in the journal for adoption.

        Events deferred for another process's (a step's publish that is not in SQL
        yet) are not waited for: the next flusher that adopts the journal writes
        them, so a worker stops as fast as one without the mirror. ``timeout``
        bounds the wait for the flusher thread's batch in flight.
        """
        if os.getpid() != self._pid:
            return  # a forked child leaves its parent's journal alone
        with self._lock:
            journal, self._journal = self._journal, None
            self._closing = True
            thread = self._thread
            self._thread = None
        self._stop.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if journal is None:
            return
        try:
            self.flush_journal(journal)
        except StoreError:
            pass  # the database is away: the journal keeps the events
        journal.close()
        atexit.unregister(self.close)


def _an_outage(exc: BaseException) -> bool:
    """An error that keeps every event in the journal to be written later, never set aside:
    the database away, or its tables missing or behind (until ``db upgrade`` has run)."""
    return isinstance(exc, Transient | SchemaNotCurrent)


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
