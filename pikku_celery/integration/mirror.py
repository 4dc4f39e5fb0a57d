"""``CeleryMirror``: one store transaction per Celery event, isolated from the task.

A mirror write never fails the user's task and never changes its result: a
transient failure is retried a bounded number of times, anything else is
logged with a stable ``action`` name, and the task goes on.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pikku_celery.errors import SerializationError, StepNotFound, Transient
from pikku_celery.store import WorkflowStore
from pikku_celery.store.attempt_writes import NewRun

__all__ = ["CeleryMirror", "PublishedStep", "unserialisable"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_DELAYS: Final = (0.05, 0.25, 1.0)


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
    """What the publishing side knows of a step when its message is sent."""

    run_id: str
    step_id: str
    step_name: str
    rpc_name: str
    data: Any
    from_step_name: str | None = None
    retries: int | None = None
    retry_delay: float | None = None
    eta: dt.datetime | None = None
    new_run: NewRun | None = None


class CeleryMirror:
    """Writes Celery's events into a ``WorkflowStore``, one transaction each."""

    def __init__(self, store: WorkflowStore, *, retry_delays: tuple[float, ...] = RETRY_DELAYS):
        self._store = store
        self._pid = os.getpid()
        self._fork_lock = threading.Lock()
        self.retry_delays = retry_delays

    @property
    def store(self) -> WorkflowStore:
        """The store, with connections made by this process (never a parent's)."""
        pid = os.getpid()
        if pid != self._pid:
            with self._fork_lock:
                if pid != self._pid:
                    self._store.dispose_after_fork()
                    self._pid = pid
        return self._store

    def _write(self, action: str, write: Callable[[], T], **context: Any) -> T | None:
        for delay in (*self.retry_delays, None):
            try:
                return write()
            except Exception as exc:
                if isinstance(exc, Transient) and delay is not None:
                    time.sleep(delay)
                    continue
                logger.error(
                    "pikku-celery could not record %s for task %s: %s",
                    action,
                    context.get("task_id"),
                    exc,
                    exc_info=not isinstance(exc, Transient),
                    extra={"action": "mirror_write_failed", "event": action, **context},
                )
                return None
        return None  # pragma: no cover - the loop always returns

    # --- publisher side ----------------------------------------------------------

    def published(self, step: PublishedStep) -> str | None:
        """Record the step as scheduled; returns the name it got in its run."""

        def write(data: Any) -> str | None:
            return self.store.schedule_step(
                step.run_id,
                step.step_id,
                step.step_name,
                step.rpc_name,
                data,
                from_step_name=step.from_step_name,
                retries=step.retries,
                retry_delay=step.retry_delay,
                eta=step.eta,
                task_id=step.step_id,
                new_run=step.new_run,
            )

        return self._write(
            "published",
            lambda: _json_or_placeholder(write, step.data),
            task_id=step.step_id,
            run_id=step.run_id,
        )

    # --- worker side -------------------------------------------------------------

    def started(
        self,
        step_id: str,
        attempt: int,
        *,
        worker: str | None,
        pid: int,
        adopt: Callable[[], PublishedStep],
    ) -> None:
        """Attempt K is running; a step never seen at publish time is adopted first."""

        def record() -> None:
            self.store.record_attempt(
                step_id,
                attempt,
                "running",
                task_id=step_id,
                worker=worker,
                pid=pid,
                reason="first" if attempt == 1 else "retry",
            )

        def write() -> None:
            try:
                record()
            except StepNotFound:
                # Published by a process without pikku-celery: record it now.
                self.published(adopt())
                record()

        self._write("started", write, task_id=step_id, attempt=attempt)

    def retried(
        self, step_id: str, attempt: int, error: Mapping[str, Any], eta: dt.datetime | None
    ) -> None:
        """Attempt K failed and attempt K+1 is scheduled, in one transaction."""

        def write() -> None:
            store = self.store
            with store.transaction() as conn:
                store.record_attempt(step_id, attempt, "failed", error=error, conn=conn)
                store.record_attempt(
                    step_id,
                    attempt + 1,
                    "scheduled",
                    eta=eta,
                    reason="retry",
                    task_id=step_id,
                    conn=conn,
                )

        self._write("retried", write, task_id=step_id, attempt=attempt)

    def succeeded(self, run_id: str | None, step_id: str, attempt: int, result: Any) -> None:
        """Attempt K succeeded; the run completes if it was its last unfinished step."""

        def write(value: Any) -> None:
            store = self.store
            with store.transaction() as conn:
                store.record_attempt(step_id, attempt, "succeeded", result=value, conn=conn)
                if run_id is not None:
                    store.complete_run_if_done(run_id, conn=conn)

        self._write(
            "succeeded",
            lambda: _json_or_placeholder(write, result),
            task_id=step_id,
            attempt=attempt,
        )

    def ended(
        self,
        run_id: str | None,
        step_id: str,
        attempt: int,
        status: str,
        error: Mapping[str, Any],
    ) -> None:
        """Attempt K ended for good (``failed`` or ``cancelled``): so do its step and run."""

        def write() -> None:
            store = self.store
            with store.transaction() as conn:
                store.record_attempt(step_id, attempt, status, error=error, conn=conn)
                if run_id is not None:
                    store.settle_run(run_id, status, error, conn=conn)

        self._write(status, write, task_id=step_id, attempt=attempt)


def _json_or_placeholder(write: Callable[[Any], T], value: Any) -> T:
    try:
        return write(value)
    except SerializationError:
        # Kept visible instead of dropped: the row says what the value was.
        return write(unserialisable(value))
