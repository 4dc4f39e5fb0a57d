"""``Recorder``: turns what a source of events saw into a typed event and hands it to its sink.

A recorder call never fails the user's task, never changes its result and makes
no database round trip on a task's path: it encodes the event's values once (one
that is not JSON becomes a marked placeholder) and hands the event to this
process's :class:`~pikku_celery.mirror.sink.EventSink`, chosen once per role
(``sinks``): when made, when serving a node, after a fork, while redirected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pikku_celery.errors import SerializationError
from pikku_celery.mirror.batches import BATCH_SIZE
from pikku_celery.mirror.deferral import GRACE
from pikku_celery.mirror.events import (
    Adoption,
    AttemptEnded,
    AttemptReplaced,
    AttemptRetried,
    AttemptStarted,
    AttemptSucceeded,
    MirrorEvent,
    ResultStored,
    StepDispatched,
    StepPublished,
    make,
    new_event_id,
)
from pikku_celery.mirror.flusher import FLUSH_INTERVAL
from pikku_celery.mirror.forks import ForkGuard
from pikku_celery.mirror.held_results import HeldResults
from pikku_celery.mirror.journal import database_folder, default_journal_dir, writable_folder
from pikku_celery.mirror.lost import LostEvents
from pikku_celery.mirror.orphans import ADOPT_INTERVAL
from pikku_celery.mirror.sink import (
    AfterCommit,
    ChordsFired,
    Committed,
    EventSink,
    Place,
    PublisherJournal,
    SinkSettings,
    SinkStats,
)
from pikku_celery.mirror.sinks import DirectSink, HostedSink, NodeSink, own_sink, publisher_sink
from pikku_celery.mirror.values import PublishedStep, routing_json, unserialisable
from pikku_celery.store import WorkflowStore, database_key

__all__ = ["Recorder"]


class Recorder:
    """Records a source's events for a ``WorkflowStore`` through this process's sink.

    ``journal_dir`` is where each process's journal lives (default
    ``PIKKU_JOURNAL_DIR``, else ``~/.local/state/pikku-celery/journal``).
    ``background=False``: no flusher thread; the owner calls :meth:`flush`.
    ``publisher="node"``: this process only appends, and a node's flusher on this machine
    writes its journal (``HostedSink``), until it serves a node or writes its own.
    """

    def __init__(
        self,
        store: WorkflowStore,
        *,
        journal_dir: Path | str | None = None,
        flush_interval: float = FLUSH_INTERVAL,
        batch_size: int = BATCH_SIZE,
        adopt_interval: float = ADOPT_INTERVAL,
        grace: float = GRACE,
        background: bool = True,
        publisher: PublisherJournal = "own",
    ):
        self._store = store
        self._journal_root = Path(journal_dir) if journal_dir is not None else None
        self._settings = SinkSettings(
            flush_interval, batch_size, adopt_interval, grace, background, publisher
        )
        self._after = AfterCommit()
        self._fork = ForkGuard(self._after_fork)
        self._lost = LostEvents()
        self._held = HeldResults()
        self._direct: DirectSink | None = None
        self._sink: EventSink = publisher_sink(self._place(), self._settings, self._after)

    # --- where events go ---------------------------------------------------------------

    def _place(self) -> Place:
        return Place(self._store, self.journal_folder, self.database_key)

    @property
    def sink(self) -> EventSink:
        """This process's sink (in a forked child, the child's own)."""
        self._fork.check()
        return self._sink

    @property
    def direct(self) -> EventSink:
        """Writes each event at once to this store (a state stored outside any task)."""
        self._fork.check()
        if self._direct is None:
            self._direct = DirectSink(self._store, self._after)
        return self._direct

    def _after_fork(self) -> None:
        self._store.dispose_after_fork()  # the parent's connections stay the parent's
        self._held = HeldResults()
        self._sink = self._sink.forked()

    def serve_node(self) -> None:
        """Write the journals of the processes this one forks from now on: they only append
        (a prefork worker's main process, before its pool starts)."""
        self._fork.check()
        if isinstance(self._sink, NodeSink):
            return
        before, self._sink = self._sink, NodeSink(self._place(), self._settings, self._after)
        before.close()

    def write_own_journal(self) -> None:
        """Write this process's journal from a flusher thread of its own from now on, even
        as a hosted publisher (a worker that forks no pool must not wait for another)."""
        self._fork.check()
        if not isinstance(self._sink, HostedSink):
            return
        before, self._sink = self._sink, own_sink(self._place(), self._settings, self._after)
        before.close()  # what it appended is adopted by the new flusher

    @contextlib.contextmanager
    def redirected(
        self, store: WorkflowStore, *, journal_dir: Path | str, background: bool = False
    ) -> Iterator[None]:
        """Within the block, record into ``store`` with journals under ``journal_dir``.

        For running an app in one process against a database of its own (the inline
        runner of ``pikku_celery.testing``). ``background=False``: no flusher thread,
        the caller writes with :meth:`flush`. Events recorded before the block are
        written to the usual store first; those of the block are written when it ends
        (what cannot be stays in ``journal_dir``). Afterwards the recorder writes to its
        usual store again; the listeners of :meth:`on_committed` stay the same throughout.
        """
        self._fork.check()
        saved = (self._store, self._journal_root, self._sink)
        # Its flusher would write to whatever store the recorder has, the redirected one too.
        self._sink.close()
        self._store, self._journal_root, self._direct = store, Path(journal_dir), None
        settings = dataclasses.replace(self._settings, background=background)
        self._sink = own_sink(self._place(), settings, self._after)
        try:
            yield
        finally:
            try:
                self._sink.close()
            finally:
                self._store, self._journal_root, self._sink = saved
                self._direct = None

    # --- the store and the journal folder ------------------------------------------------

    @property
    def store(self) -> WorkflowStore:
        """The store, with connections made by this process (never a parent's)."""
        self._fork.check()
        return self._store

    @property
    def journal_folder(self) -> Path:
        """The folder of this database's journals."""
        root = self._journal_root or default_journal_dir()
        return database_folder(root, self.database_key)

    @property
    def database_key(self) -> str:
        """The database the journals are for, as every journal records it."""
        return database_key(self._store.engine.url)

    def check_journal(self) -> Path:
        """The journal folder, proven writable (``ConfigurationError`` if it is not)."""
        return writable_folder(self.journal_folder)

    # --- the sink's face ----------------------------------------------------------------

    @property
    def journal_depth(self) -> int:
        """Events of this process that wait for SQL."""
        return self.sink.depth()

    def stats(self) -> SinkStats:
        """Events appended and written, commits, and each event's lag to its COMMIT."""
        return self.sink.stats()

    @property
    def journal_failures(self) -> int:
        """Events this process could not journal (a full or read-only disk): lost."""
        return self._lost.count

    def on_committed(self, listener: Committed) -> None:
        """Called with the durable-workflow runs to replay, after their step's end commits."""
        self._after.on_committed(listener)

    def on_chords_fired(self, listener: ChordsFired) -> None:
        """Called with the chords whose bodies are due, after the batch that completed them."""
        self._after.on_chords_fired(listener)

    def start(self) -> None:
        """Start this process's flusher now (it adopts journals of processes that are gone)."""
        self.sink.start()

    def flush(self) -> bool:
        """Write what this process journaled, now; False when the database is away."""
        return self.sink.flush()

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        """Write journals left by processes that are gone; returns how many events.

        ``set_aside_too``: try the events they set aside again as well.
        """
        return self.sink.adopt_orphans(set_aside_too=set_aside_too)

    def close(self, timeout: float = 10.0) -> None:
        """Write what can be written; a journal that still holds events stays for adoption."""
        if self._fork.forked:
            return  # a forked child leaves its parent's journal alone
        self._sink.close(timeout)

    # --- events ---------------------------------------------------------------------------

    def _record(
        self, kind: type[MirrorEvent], step_id: str, at: float | None = None, **fields: Any
    ) -> None:
        self._append(make(kind, step_id, at, **fields))

    def _append(self, event: MirrorEvent) -> None:
        try:
            self.sink.append(event)
        except Exception as exc:  # a full or read-only disk: nothing left to keep it in
            self._lost.lost(event, exc, self.journal_folder)

    def _json(self, value: Any, what: str) -> str:
        codec = self._store.codec
        try:
            return codec.encode(value, what)
        except SerializationError:
            # Kept visible instead of dropped: the row says what the value was.
            return codec.encode(unserialisable(value), what)

    def _ended(self, step_id: str) -> None:
        """An attempt's end is recorded: the result its task stored follows it."""
        held = self._held.take(step_id)
        if held is not None:
            self._append(held)

    def published(self, step: PublishedStep) -> None:
        """The step's message is out: it is scheduled, attempt 1."""
        run = step.new_run
        data_json = self._json(step.data, f"input of step {step.step_name!r}")
        self._record(
            StepPublished,
            step.step_id,
            step.at,
            run_id=step.run_id,
            step_name=step.step_name,
            rpc_name=step.rpc_name,
            data_json=data_json,
            parent_step_id=step.parent_step_id,
            retries=step.retries,
            retry_delay=step.retry_delay,
            eta=None if step.eta is None else step.eta.timestamp(),
            new_run=None
            if run is None
            else (
                run.workflow,
                # A lone task's input is its step's: encoded once.
                data_json if run.input is step.data else self._json(run.input, "run input"),
                None if run.wire is None else self._json(run.wire, "wire"),
            ),
            routing_json=routing_json(step.routing),
            chord_body=step.chord_body,
        )

    def dispatched(self, step_id: str, attempt: int) -> None:
        """The message of a step claimed by a replay is out."""
        self._record(StepDispatched, step_id, attempt=attempt)

    def started(
        self,
        step_id: str,
        attempt: int,
        *,
        worker: str | None,
        pid: int,
        adoption: Adoption | None = None,
        delivery: bool = True,
    ) -> None:
        """Attempt K runs; ``adoption`` records the step if no publisher did; ``delivery``:
        it is a delivery of the attempt's message (not its replacement taking over)."""
        # Made here rather than by make(**fields): a pool process makes one per task.
        self._append(
            AttemptStarted(
                id=new_event_id(),
                at=time.time(),
                step_id=step_id,
                attempt=attempt,
                worker=worker,
                pid=pid,
                adoption=adoption,
                delivery=delivery,
            )
        )

    def adoption(
        self,
        run_id: str,
        step_name: str,
        rpc_name: str,
        *,
        published: bool,
        data: Any = None,
        retries: int | None = None,
        retry_delay: float | None = None,
        routing: Mapping[str, Any] | None = None,
        sent_at: float | None = None,
        eta: float | None = None,
        chord_body: str | None = None,
    ) -> Adoption:
        """What a worker knows of a step; its input is kept only when it records the step
        itself (``published`` False: see :class:`~pikku_celery.mirror.events.Adoption`)."""
        return Adoption(
            run_id=run_id,
            step_name=step_name,
            rpc_name=rpc_name,
            published=published,
            data_json=None if published else self._json(data, f"input of step {step_name!r}"),
            retries=retries,
            retry_delay=retry_delay,
            routing_json=routing_json(routing),
            sent_at=sent_at,
            eta=eta,
            chord_body=chord_body,
        )

    def retried(
        self,
        step_id: str,
        attempt: int,
        error: Mapping[str, Any],
        eta: dt.datetime | None,
        *,
        at: float | None = None,
        retries: int | None = None,
        retry_delay: float | None = None,
    ) -> None:
        """Attempt K failed (at ``at``, default now) and attempt K+1 is scheduled; the step
        gets ``retries`` and ``retry_delay`` from now on."""
        self._record(
            AttemptRetried,
            step_id,
            at,
            attempt=attempt,
            error_json=self._json(dict(error), "error"),
            eta=None if eta is None else eta.timestamp(),
            retries=retries,
            retry_delay=retry_delay,
        )
        self._ended(step_id)

    def succeeded(
        self,
        run_id: str | None,
        step_id: str,
        attempt: int,
        result: Any,
        *,
        orchestrated: bool = False,
    ) -> None:
        """Attempt K succeeded; the run completes if it was its last unfinished step."""
        self._append(
            AttemptSucceeded(
                id=new_event_id(),
                at=time.time(),
                step_id=step_id,
                attempt=attempt,
                run_id=run_id,
                result_json=self._json(result, "step result"),
                orchestrated=orchestrated,
            )
        )
        self._ended(step_id)

    def ended(
        self,
        run_id: str | None,
        step_id: str,
        attempt: int | None,
        status: str,
        error: Mapping[str, Any],
        *,
        orchestrated: bool = False,
        chord_bodies: tuple[str, ...] = (),
    ) -> None:
        """Attempt K ended for good (``failed`` or ``cancelled``): so do its step and run,
        and the runs its chords hold (``chord_bodies``: their bodies, never sent now).

        ``attempt``/``run_id`` None: the step's current attempt and its run.
        """
        self._record(
            AttemptEnded,
            step_id,
            attempt=attempt,
            run_id=run_id,
            status=status,
            error_json=self._json(dict(error), "error"),
            orchestrated=orchestrated,
            chord_bodies=chord_bodies,
        )
        self._ended(step_id)

    def replaced(self, step_id: str, attempt: int, replaced_by: str) -> None:
        """Attempt K replaced itself; task ``replaced_by`` carries its task id on."""
        self._record(AttemptReplaced, step_id, attempt=attempt, replaced_by=replaced_by)

    # --- the result backend's events ---------------------------------------------------------

    def append(self, event: MirrorEvent) -> None:
        """Hand an event made elsewhere (the result backend's) to the sink now."""
        self._append(event)

    def result_after_attempt(self, event: ResultStored) -> None:
        """A task's state stored by its end while it runs here: handed to the sink right
        after that attempt's own end (or, for a task with no mirrored end, by
        :meth:`release` when it has run)."""
        self._held.hold(event)

    def release(self, task_id: str) -> bool:
        """The task has run: a state it stored that no end of its handed on goes now.
        True when the task's result was handed to the sink (now or by its end)."""
        held, before = self._held.ran(task_id)
        if held is not None:
            self._append(held)
        return before or held is not None
