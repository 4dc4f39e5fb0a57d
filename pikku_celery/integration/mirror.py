"""``CeleryMirror``: one store transaction per Celery event, isolated from the task.

A mirror write never fails the user's task and never changes its result. When
the database cannot be reached, events go to this process's local spool (see
``store.spool``) in order, and a background thread replays them once the
database is back; later events queue behind them, so the order holds. A
process that dies with a non-empty spool leaves it for the next process to
adopt. Anything else that fails is logged with a stable ``action`` name, and
the task goes on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from pikku_celery.errors import SerializationError, StepNotFound, Transient
from pikku_celery.store import WorkflowStore
from pikku_celery.store.attempt_writes import NewRun
from pikku_celery.store.engine import safe_url
from pikku_celery.store.spool import Spool, default_spool_dir, orphaned_spools, spool_folder

__all__ = ["CeleryMirror", "PublishedStep", "unserialisable"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Short: a longer outage goes to the spool instead of holding up the task.
RETRY_DELAYS: Final = (0.05,)
# Spools of a parent process, kept referenced in its forked children: closing
# (or collecting) an SQLite connection or a lock inherited across fork would
# act on the parent's.
_INHERITED: list[Spool] = []


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
    """Writes Celery's events into a ``WorkflowStore``, one transaction each.

    ``spool_dir`` is where events wait while the database is away (default
    ``PIKKU_SPOOL_DIR``, else ``~/.local/state/pikku-celery/spool``).
    """

    def __init__(
        self,
        store: WorkflowStore,
        *,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        spool_dir: Path | str | None = None,
        drain_interval: float = 0.5,
    ):
        self._store = store
        self._pid = os.getpid()
        self._fork_lock = threading.Lock()
        self.retry_delays = retry_delays
        self.drain_interval = drain_interval
        self._spool_root = Path(spool_dir) if spool_dir is not None else None
        self._lock = threading.Lock()
        self._spool: Spool | None = None
        self._backlog = False
        self._spooled = 0
        self._outage_started = 0.0
        self._drainer: threading.Thread | None = None

    @property
    def store(self) -> WorkflowStore:
        """The store, with connections made by this process (never a parent's)."""
        pid = os.getpid()
        if pid != self._pid:
            with self._fork_lock:
                if pid != self._pid:
                    self._store.dispose_after_fork()
                    self._after_fork()
                    self._pid = pid
        return self._store

    def _after_fork(self) -> None:
        # The parent's spool (and its drainer thread, which did not survive the
        # fork) stay the parent's business.
        if self._spool is not None:
            _INHERITED.append(self._spool)
        self._lock = threading.Lock()
        self._spool = None
        self._backlog = False
        self._spooled = 0
        self._drainer = None

    @property
    def spool_folder(self) -> Path:
        """The folder of this database's spools."""
        root = self._spool_root or default_spool_dir()
        return spool_folder(root, safe_url(self._store.engine.url))

    @property
    def spool_depth(self) -> int:
        """Events this process has waiting for the database."""
        with self._lock:
            return self._spool.depth() if self._spool is not None else 0

    # --- delivery ----------------------------------------------------------------

    def _deliver(self, kind: str, event: dict[str, Any]) -> Any:
        self.store  # noqa: B018 - a forked child drops its parent's connections and spool
        with self._lock:
            if self._backlog:  # earlier events wait in the spool: queue behind them
                self._to_spool(kind, event)
                return None
        for delay in (*self.retry_delays, None):
            try:
                return self._apply(kind, event)
            except Exception as exc:
                if not isinstance(exc, Transient):
                    self._failed(kind, event, exc)
                    return None
                if delay is None:
                    with self._lock:
                        self._to_spool(kind, event, cause=exc)
                    return None
                time.sleep(delay)
        return None  # pragma: no cover - the loop always returns

    def _to_spool(
        self, kind: str, event: dict[str, Any], cause: BaseException | None = None
    ) -> None:
        """Append to this process's spool (caller holds ``_lock``) and make sure it drains."""
        try:
            if self._spool is None:
                self._spool = Spool.for_process(self.spool_folder, self)
            self._spool.append(kind, json.dumps(event, default=_spoolable))
        except Exception as exc:  # a full or read-only disk: nothing left to keep it in
            self._failed(kind, event, exc)
            return
        self._spooled += 1
        if not self._backlog:
            self._backlog = True
            self._outage_started = time.monotonic()
            logger.warning(
                "pikku-celery cannot reach the workflow database (%s); keeping mirror events "
                "in %s until it is back",
                cause,
                self._spool.path,
                extra={"action": "mirror_spooling", "spool": str(self._spool.path)},
            )
        if self._drainer is None or not self._drainer.is_alive():
            self._drainer = threading.Thread(
                target=self._drain_loop, name="pikku-celery-spool", daemon=True
            )
            self._drainer.start()

    def _failed(self, kind: str, event: Mapping[str, Any], exc: BaseException) -> None:
        logger.error(
            "pikku-celery could not record %s for task %s: %s",
            kind,
            event.get("step_id"),
            exc,
            exc_info=not isinstance(exc, Transient),
            extra={
                "action": "mirror_write_failed",
                "event": kind,
                "task_id": event.get("step_id"),
                "run_id": event.get("run_id"),
            },
        )

    def _drain_loop(self) -> None:
        delay = self.drain_interval
        while True:
            time.sleep(delay)
            spool = self._spool
            if spool is None:
                return  # closed: what is left stays on disk for the next process
            try:
                replayed = self._replay(spool)
            except Exception:
                logger.exception(
                    "pikku-celery could not replay its spool %s; it stays on disk for the "
                    "next worker to start (or `pikku-celery spool --replay`)",
                    spool.path,
                    extra={"action": "spool_replay_failed"},
                )
                return
            if replayed:
                with self._lock:
                    if self._spool is spool and spool.depth() == 0:
                        self._backlog = False
                        self._drainer = None
                        logger.warning(
                            "pikku-celery caught up: %d mirror events written from the spool "
                            "after %.1fs",
                            self._spooled,
                            time.monotonic() - self._outage_started,
                            extra={"action": "mirror_caught_up", "count": self._spooled},
                        )
                        self._spooled = 0
                        break
                continue  # more came in while it replayed
            delay = min(delay * 2, 2.0)
        self.adopt_orphans()

    def _replay(self, spool: Spool) -> bool:
        """Write the spool's events in order; False when the database is still away."""
        while batch := spool.peek():
            done = None
            for event in batch:
                try:
                    self._apply(event.kind, json.loads(event.payload))
                except Exception as exc:
                    if isinstance(exc, Transient):
                        if done is not None:
                            spool.remove_through(done)
                        return False
                    # Replaying it again would fail again: say so, and go on.
                    self._failed(event.kind, json.loads(event.payload), exc)
                done = event.seq
            if done is not None:
                spool.remove_through(done)
        return True

    def adopt_orphans(self) -> int:
        """Replay spools left by processes that are gone; returns how many events were written."""
        written = 0
        try:
            for spool in orphaned_spools(self.spool_folder):
                depth = spool.depth()
                replayed = self._replay(spool)
                left = spool.depth()
                written += depth - left
                spool.close()
                if depth:
                    logger.warning(
                        "pikku-celery replayed %d mirror events left in %s by a process "
                        "that ended%s",
                        depth - left,
                        spool.path,
                        "" if replayed else f"; {left} wait for the database",
                        extra={"action": "spool_adopted", "count": depth - left},
                    )
                if not replayed:
                    break
        except Exception:
            logger.exception(
                "pikku-celery could not replay a left-over spool",
                extra={"action": "spool_adopt_failed"},
            )
        return written

    def close(self) -> None:
        """Write what can be written; a spool that still holds events stays for later."""
        with self._lock:
            spool, self._spool = self._spool, None
        if spool is not None:
            self._replay(spool)
            spool.close()

    # --- events ------------------------------------------------------------------

    def _apply(self, kind: str, event: dict[str, Any]) -> Any:
        return _APPLY[kind](self, event)

    def published(self, step: PublishedStep) -> str | None:
        """Record the step as scheduled; returns the name it got in its run (None if spooled)."""
        result: str | None = self._deliver("published", _published_event(step))
        return result

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
        event = {"step_id": step_id, "attempt": attempt, "worker": worker, "pid": pid}
        # Called only if the step turns out unknown, or the event is spooled.
        self._deliver("started", {**event, "adopt": adopt})

    def retried(
        self, step_id: str, attempt: int, error: Mapping[str, Any], eta: dt.datetime | None
    ) -> None:
        """Attempt K failed and attempt K+1 is scheduled, in one transaction."""
        event = {"step_id": step_id, "attempt": attempt, "error": dict(error), "eta": _iso(eta)}
        self._deliver("retried", event)

    def succeeded(self, run_id: str | None, step_id: str, attempt: int, result: Any) -> None:
        """Attempt K succeeded; the run completes if it was its last unfinished step."""
        event = {"run_id": run_id, "step_id": step_id, "attempt": attempt, "result": result}
        self._deliver("succeeded", event)

    def ended(
        self,
        run_id: str | None,
        step_id: str,
        attempt: int,
        status: str,
        error: Mapping[str, Any],
    ) -> None:
        """Attempt K ended for good (``failed`` or ``cancelled``): so do its step and run."""
        event = {
            "run_id": run_id,
            "step_id": step_id,
            "attempt": attempt,
            "status": status,
            "error": dict(error),
        }
        self._deliver("ended", event)


# --- how each event is written ---------------------------------------------------


def _iso(moment: dt.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _moment(text: str | None) -> dt.datetime | None:
    return None if text is None else dt.datetime.fromisoformat(text)


def _published_event(step: PublishedStep) -> dict[str, Any]:
    # Shallow on purpose: the call's arguments are not copied on the hot path.
    event = {field.name: getattr(step, field.name) for field in dataclasses.fields(step)}
    event["eta"] = _iso(step.eta)
    if step.new_run is not None:
        run = step.new_run
        event["new_run"] = {"workflow": run.workflow, "input": run.input, "wire": run.wire}
    return event


def _spoolable(value: Any) -> Any:
    """What ``json.dumps`` cannot write as it is: a step to adopt, or a placeholder."""
    if isinstance(value, PublishedStep):
        return _published_event(value)
    if callable(value):  # the step to adopt, made only now that it is spooled
        return _spoolable(value())
    return unserialisable(value)


def _apply_published(mirror: CeleryMirror, event: dict[str, Any]) -> str | None:
    new_run = event.get("new_run")

    def write(data: Any) -> str | None:
        return mirror.store.schedule_step(
            event["run_id"],
            event["step_id"],
            event["step_name"],
            event["rpc_name"],
            data,
            from_step_name=event.get("from_step_name"),
            retries=event.get("retries"),
            retry_delay=event.get("retry_delay"),
            eta=_moment(event.get("eta")),
            task_id=event["step_id"],
            new_run=None if new_run is None else NewRun(**new_run),
        )

    return _json_or_placeholder(write, event["data"])


def _apply_started(mirror: CeleryMirror, event: dict[str, Any]) -> None:
    def record() -> None:
        mirror.store.record_attempt(
            event["step_id"],
            event["attempt"],
            "running",
            task_id=event["step_id"],
            worker=event.get("worker"),
            pid=event.get("pid"),
            reason="first" if event["attempt"] == 1 else "retry",
        )

    try:
        record()
    except StepNotFound:
        # Published by a process without pikku-celery: record it now.
        adopt = event["adopt"]
        if callable(adopt):
            adopt = adopt()
        if isinstance(adopt, PublishedStep):
            adopt = _published_event(adopt)
        _apply_published(mirror, adopt)
        record()


def _apply_retried(mirror: CeleryMirror, event: dict[str, Any]) -> None:
    store = mirror.store
    step_id, attempt = event["step_id"], event["attempt"]
    with store.transaction() as conn:
        store.record_attempt(step_id, attempt, "failed", error=event["error"], conn=conn)
        store.record_attempt(
            step_id,
            attempt + 1,
            "scheduled",
            eta=_moment(event.get("eta")),
            reason="retry",
            task_id=step_id,
            conn=conn,
        )


def _apply_succeeded(mirror: CeleryMirror, event: dict[str, Any]) -> None:
    store = mirror.store
    run_id = event.get("run_id")

    def write(value: Any) -> None:
        with store.transaction() as conn:
            store.record_attempt(
                event["step_id"], event["attempt"], "succeeded", result=value, conn=conn
            )
            if run_id is not None:
                store.complete_run_if_done(run_id, conn=conn)

    _json_or_placeholder(write, event["result"])


def _apply_ended(mirror: CeleryMirror, event: dict[str, Any]) -> None:
    store = mirror.store
    run_id, status = event.get("run_id"), event["status"]
    with store.transaction() as conn:
        store.record_attempt(
            event["step_id"], event["attempt"], status, error=event["error"], conn=conn
        )
        if run_id is not None:
            store.settle_run(run_id, status, event["error"], conn=conn)


_APPLY: Final[dict[str, Callable[[CeleryMirror, dict[str, Any]], Any]]] = {
    "published": _apply_published,
    "started": _apply_started,
    "retried": _apply_retried,
    "succeeded": _apply_succeeded,
    "ended": _apply_ended,
}


def _json_or_placeholder(write: Callable[[Any], T], value: Any) -> T:
    try:
        return write(value)
    except SerializationError:
        # Kept visible instead of dropped: the row says what the value was.
        return write(unserialisable(value))
