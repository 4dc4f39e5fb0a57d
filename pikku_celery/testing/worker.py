"""``InlineWorker``: runs one broker message the way a Celery worker's pool does.

Each task message becomes a :class:`celery.worker.request.Request` and runs
through its ``execute()``, so Celery's own tracer sends ``task_prerun``,
``task_retry``, ``task_success``, ``task_failure`` and ``task_revoked``, and a
retry is ``task.retry()`` publishing a new message (never eager recursion).
Revokes are read from the app's control mailbox, as a worker's consumer does.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from celery import Celery
from celery.worker import state as worker_state
from celery.worker.request import Request

from pikku_celery.errors import ConfigurationError
from pikku_celery.testing.broker import InMemoryBroker

__all__ = ["InlineWorker"]

logger = logging.getLogger(__name__)


class InlineWorker:
    """Executes messages of ``broker`` in the calling thread, under ``hostname``."""

    def __init__(self, app: Celery, broker: InMemoryBroker, hostname: str | None = None) -> None:
        self.app = app
        self.broker = broker
        self.hostname = hostname or f"inline@{socket.gethostname()}"
        mailbox: Any = app.control.mailbox  # type: ignore[attr-defined]
        self._mailbox_queue = mailbox.get_queue(self.hostname)
        self._revoked: set[str] = set()
        self._traced: set[Any] = set()

    @property
    def control_queues(self) -> frozenset[str]:
        """Queues of the control mailbox: never task messages."""
        return frozenset({self._mailbox_queue.name})

    def start(self) -> None:
        # Bound like a worker's pidbox, so `app.control.revoke(...)` reaches this worker.
        self.broker.declare(self._mailbox_queue)

    def stop(self) -> None:
        # The revoked ids and tracers are process-wide in Celery: leave none of ours behind.
        for task_id in self._revoked:
            worker_state.revoked.discard(task_id)
        self._revoked.clear()
        for task in self._traced:
            task.__trace__ = None
        self._traced.clear()

    # --- control --------------------------------------------------------------------

    def read_control(self) -> None:
        """Apply every control message waiting (revokes; other commands are ignored)."""
        while (message := self.broker.get(self._mailbox_queue.name)) is not None:
            try:
                self._control(message.decode())
            finally:
                message.ack()

    def _control(self, body: Any) -> None:
        if not isinstance(body, dict):
            return
        destination = body.get("destination")
        if destination and self.hostname not in destination:
            return
        method = body.get("method")
        if method != "revoke":
            logger.debug("inline worker ignores control command %r", method)
            return
        ids = (body.get("arguments") or {}).get("task_id") or []
        for task_id in [ids] if isinstance(ids, str) else list(ids):
            worker_state.revoked.add(str(task_id))
            self._revoked.add(str(task_id))

    # --- tasks ----------------------------------------------------------------------

    def execute(self, message: Any) -> None:
        """Run one message: a task (as a worker would), anything else is dropped."""
        headers = message.headers or {}
        name = headers.get("task")
        if name is None:
            body = message.payload
            if isinstance(body, dict) and "task" in body:
                message.ack()
                raise ConfigurationError(
                    f"Task {body['task']!r} was sent with message protocol 1, which carries "
                    "none of the headers the mirror follows; leave task_protocol at 2."
                )
            message.ack()
            logger.debug("inline worker dropped a message that is not a task: %r", headers)
            return
        task = self.app.tasks.get(name)
        if task is None:
            message.reject(requeue=False)
            raise ConfigurationError(
                f"A message asks for task {name!r}, which app {self.app.main!r} does not "
                "define; import the module that declares it before the runner starts."
            )
        request = Request(
            message,
            on_ack=message.ack_log_error,
            on_reject=message.reject_log_error,
            app=self.app,
            hostname=self.hostname,
            task=task,
        )
        if task.__trace__ is None:
            self._traced.add(task)
        # The broker hands a message with an ETA over only once the runner's clock has
        # reached it, so it runs now, as a worker's timer would run it then.
        request.execute()
