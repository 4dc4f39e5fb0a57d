"""``CeleryMirror``: turns what a signal handler saw into a typed event and journals it.

A mirror call never fails the user's task and never changes its result, and
it makes no database round trip: it encodes the event's values (a value that
is not JSON becomes a marked placeholder), appends the event to this
process's journal and returns. The delivery's flusher writes it to SQL in
the next group commit (see ``delivery``); ``apply`` says which rows each
event moves.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pikku_celery.errors import ConfigurationError, SerializationError
from pikku_celery.mirror.delivery import (
    ADOPT_INTERVAL,
    BATCH_SIZE,
    FLUSH_INTERVAL,
    GRACE,
    ChordsFired,
    Committed,
    Delivery,
    DeliveryStats,
)
from pikku_celery.mirror.events import (
    Adoption,
    AttemptEnded,
    AttemptReplaced,
    AttemptRetried,
    AttemptStarted,
    AttemptSucceeded,
    ChordApplied,
    ChordExtended,
    ChordSent,
    MirrorEvent,
    ResultStored,
    StepDispatched,
    StepPublished,
    new_event_id,
)
from pikku_celery.mirror.forks import ForkGuard
from pikku_celery.mirror.journal import (
    ENV_JOURNAL_DIR,
    database_folder,
    default_journal_dir,
    probe_folder,
)
from pikku_celery.store import NewRun, WorkflowStore, database_key

__all__ = ["CeleryMirror", "PublishedStep", "unserialisable"]

logger = logging.getLogger(__name__)

# Seconds between two log lines about events that could not be journaled.
_FAILURE_LOG_EVERY: Final = 60.0


def unserialisable(value: Any) -> dict[str, Any]:
    """The marked placeholder stored for a value that is not JSON."""
    text = repr(value)
    return {
        "__pikku_unserialisable__": True,
        "type": f"{type(value).__module__}.{type(value).__qualname__}",
        "repr": text if len(text) <= 2000 else text[:1999] + "…",
    }


@dataclass(frozen=True, slots=True)
class PublishedStep:
    """What the publishing side knows of a step when its message is sent.

    ``parent_step_id``: the step it follows, by id (its name, ``add#2`` say,
    is only known once that step is in SQL).
    """

    run_id: str
    step_id: str
    step_name: str
    rpc_name: str
    data: Any
    parent_step_id: str | None = None
    retries: int | None = None
    retry_delay: float | None = None
    eta: dt.datetime | None = None
    new_run: NewRun | None = None
    routing: Mapping[str, Any] | None = None
    #: A chord's header task: the task id of the chord's body, which holds the run open.
    chord_body: str | None = None


class CeleryMirror:
    """Journals Celery's events for a ``WorkflowStore``; a flusher writes them in batches.

    ``journal_dir`` is where each process's journal lives (default
    ``PIKKU_JOURNAL_DIR``, else ``~/.local/state/pikku-celery/journal``).
    ``background=False``: no flusher thread; the owner calls :meth:`flush`.
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
    ):
        self._store = store
        self._fork = ForkGuard(self._after_fork)
        self._journal_root = Path(journal_dir) if journal_dir is not None else None
        self._journal_failures = 0
        self._failure_logged_at = -_FAILURE_LOG_EVERY
        self.delivery = Delivery(
            lambda: self.store,
            lambda: self.journal_folder,
            lambda: self.database_key,
            flush_interval=flush_interval,
            batch_size=batch_size,
            adopt_interval=adopt_interval,
            grace=grace,
            background=background,
        )

    @property
    def store(self) -> WorkflowStore:
        """The store, with connections made by this process (never a parent's)."""
        self._fork.check()
        return self._store

    def _after_fork(self) -> None:
        self._store.dispose_after_fork()

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
        """The journal folder, proven writable; ``ConfigurationError`` naming it if it is not.

        A mirror that cannot journal loses every event, so a process finds out at once
        (a worker refuses to start), not one ERROR line per event later.
        """
        folder = self.journal_folder
        try:
            probe_folder(folder)
        except OSError as exc:
            raise ConfigurationError(
                f"pikku-celery cannot write its journal folder {folder} ({exc.strerror or exc}): "
                f"point {ENV_JOURNAL_DIR} (or app.conf.pikku_journal_dir) at a folder this "
                "process can write, on a local disk."
            ) from exc
        return folder

    @property
    def journal_depth(self) -> int:
        """Events of this process that wait for SQL."""
        return self.delivery.depth()

    def delivery_stats(self) -> DeliveryStats:
        """Events appended and written, commits, and each event's lag to its COMMIT."""
        return self.delivery.stats()

    def on_committed(self, listener: Committed) -> None:
        """Called with the durable-workflow runs to replay, after their step's end commits."""
        self.delivery.on_committed(listener)

    def on_chords_fired(self, listener: ChordsFired) -> None:
        """Called with the chords whose bodies are due, after the batch that completed them."""
        self.delivery.on_chords_fired(listener)

    def start(self) -> None:
        """Start this process's flusher now (it adopts journals of processes that are gone)."""
        self.delivery.start()

    def serve_node(self) -> None:
        """Write the journals of the processes this one forks from now on: they only append
        (a prefork worker's main process, before its pool starts)."""
        self.delivery.serve_node()

    def flush(self) -> bool:
        """Write what this process journaled, now; False when the database is away."""
        return self.delivery.flush()

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        """Write journals left by processes that are gone; returns how many events.

        ``set_aside_too``: try the events they set aside again as well.
        """
        return self.delivery.adopt_orphans(set_aside_too=set_aside_too)

    def close(self, timeout: float = 10.0) -> None:
        """Write what can be written; a journal that still holds events stays for adoption."""
        self.delivery.close(timeout)

    @contextlib.contextmanager
    def redirected(
        self, store: WorkflowStore, *, journal_dir: Path | str, background: bool = False
    ) -> Iterator[None]:
        """Within the block, mirror into ``store`` with journals under ``journal_dir``.

        For running an app in one process against a database of its own (the
        inline runner of ``pikku_celery.testing``). ``background=False``: no
        flusher thread, the caller writes the journal with :meth:`flush`. Events
        journaled before the block are written to the usual store first; those of
        the block are written when it ends (what cannot be stays in
        ``journal_dir``). Afterwards the mirror writes to its usual store again;
        the listeners of :meth:`on_committed` stay the same throughout.
        """
        saved = (self._store, self._journal_root, self.delivery)
        # Its flusher would write to whatever store the mirror has, the redirected one too.
        self.delivery.close()
        self._store, self._journal_root = store, Path(journal_dir)
        self.delivery = saved[2].twin(
            lambda: self.store,
            lambda: self.journal_folder,
            lambda: self.database_key,
            background=background,
        )
        try:
            yield
        finally:
            try:
                self.delivery.close()
            finally:
                self._store, self._journal_root, self.delivery = saved

    # --- events ----------------------------------------------------------------------

    @property
    def journal_failures(self) -> int:
        """Events this process could not journal (a full or read-only disk): they are lost."""
        return self._journal_failures

    def _append(self, event: MirrorEvent) -> None:
        try:
            self.delivery.append(event)
        except Exception as exc:  # a full or read-only disk: nothing left to keep it in
            self._journal_failures += 1
            now = time.monotonic()
            if now - self._failure_logged_at < _FAILURE_LOG_EVERY:
                return  # one line per interval, not one per event of a busy worker
            self._failure_logged_at = now
            logger.error(
                "pikku-celery could not journal %s for task %s (%d events lost in this "
                "process so far): %s; free the disk of %s or point %s elsewhere",
                event.kind,
                event.step_id,
                self._journal_failures,
                exc,
                self.journal_folder,
                ENV_JOURNAL_DIR,
                extra={
                    "action": "mirror_write_failed",
                    "event": event.kind,
                    "task_id": event.step_id,
                    "count": self._journal_failures,
                },
            )

    def _json(self, value: Any, what: str) -> str:
        codec = self._store.codec
        try:
            return codec.encode(value, what)
        except SerializationError:
            # Kept visible instead of dropped: the row says what the value was.
            return codec.encode(unserialisable(value), what)

    def published(self, step: PublishedStep) -> None:
        """The step's message is out: it is scheduled, attempt 1."""
        run = step.new_run
        data_json = self._json(step.data, f"input of step {step.step_name!r}")
        self._append(
            StepPublished(
                id=new_event_id(),
                at=time.time(),
                step_id=step.step_id,
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
                routing_json=_routing_json(step.routing),
                chord_body=step.chord_body,
            )
        )

    def dispatched(self, step_id: str, attempt: int) -> None:
        """The message of a step claimed by a replay is out."""
        self._append(
            StepDispatched(id=new_event_id(), at=time.time(), step_id=step_id, attempt=attempt)
        )

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
    ) -> Adoption:
        """What a worker knows of a step; its input is kept only when no publisher has it."""
        return Adoption(
            run_id=run_id,
            step_name=step_name,
            rpc_name=rpc_name,
            published=published,
            data_json=None if published else self._json(data, f"input of step {step_name!r}"),
            retries=retries,
            retry_delay=retry_delay,
            routing_json=_routing_json(routing),
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
        self._append(
            AttemptRetried(
                id=new_event_id(),
                at=time.time() if at is None else at,
                retries=retries,
                retry_delay=retry_delay,
                step_id=step_id,
                attempt=attempt,
                error_json=self._json(dict(error), "error"),
                eta=None if eta is None else eta.timestamp(),
            )
        )

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

    def result_stored(
        self,
        task_id: str,
        attempt: int | None,
        state: str,
        meta: bytes,
        date_done: dt.datetime | None = None,
    ) -> None:
        """Celery's result backend stored a task's state (``backend="pikku://"``)."""
        self._append(
            ResultStored(
                id=new_event_id(),
                at=time.time(),
                step_id=task_id,
                attempt=attempt,
                state=state,
                meta_b64=base64.b64encode(meta).decode("ascii"),
                date_done=None if date_done is None else date_done.timestamp(),
            )
        )

    def chord_applied(self, group_id: str, parts: Sequence[str], body: bytes) -> None:
        """A chord for ``backend="pikku://"`` to finish, before its header is published:
        journaled, so publishing a chord needs no database."""
        self._append(
            ChordApplied(
                id=new_event_id(),
                at=time.time(),
                step_id=group_id,
                parts=tuple(parts),
                body_b64=base64.b64encode(body).decode("ascii"),
            )
        )

    def chord_extended(self, group_id: str, part: str) -> None:
        """A header task added task ``part`` to its chord, before publishing it."""
        self._append(ChordExtended(id=new_event_id(), at=time.time(), step_id=group_id, part=part))

    def chord_sent(self, group_id: str) -> None:
        """A fired chord's body is out: the reaper never sends it again."""
        self._append(ChordSent(id=new_event_id(), at=time.time(), step_id=group_id))

    def replaced(self, step_id: str, attempt: int, replaced_by: str) -> None:
        """Attempt K replaced itself; task ``replaced_by`` carries its task id on."""
        self._append(
            AttemptReplaced(
                id=new_event_id(),
                at=time.time(),
                step_id=step_id,
                attempt=attempt,
                replaced_by=replaced_by,
            )
        )

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
        self._append(
            AttemptEnded(
                id=new_event_id(),
                at=time.time(),
                step_id=step_id,
                attempt=attempt,
                run_id=run_id,
                status=status,
                error_json=self._json(dict(error), "error"),
                orchestrated=orchestrated,
                chord_bodies=chord_bodies,
            )
        )


# A process sends to a few queues: each one's routing is encoded once, not per event.
_ROUTINGS: dict[tuple[Any, Any], str | None] = {}
_ROUTINGS_KEPT: Final = 256


def _routing_json(routing: Mapping[str, Any] | None) -> str | None:
    """Where a message went, kept only as far as it can be sent there again."""
    if not routing:
        return None
    key = (routing.get("exchange"), routing.get("routing_key"))
    try:
        return _ROUTINGS[key]
    except (KeyError, TypeError):  # TypeError: a value that is no dict key
        pass
    kept = {
        name: str(value)
        for name, value in zip(("exchange", "routing_key"), key, strict=True)
        if value is not None
    }
    encoded = json.dumps(kept, separators=(",", ":")) if kept else None
    if len(_ROUTINGS) >= _ROUTINGS_KEPT:
        _ROUTINGS.clear()
    with contextlib.suppress(TypeError):
        _ROUTINGS[key] = encoded
    return encoded
