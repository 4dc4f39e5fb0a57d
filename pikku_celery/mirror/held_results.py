"""A result behind its attempt's end: the rule that a task's stored state never reaches SQL
before the attempt that stored it has ended there.

Celery stores a task's SUCCESS, FAILURE or RETRY (``mark_as_done`` and its
kin) before it sends the signal that ends the attempt. Were the result handed
to the sink first, a reader could see SUCCESS while SQL shows the attempt
running. So the result is held in this process until the attempt's own end is
handed over, and follows it at once (or when the task has run, for a task the
mirror records no end of). Held in memory, as Celery holds the request: a
process killed in between loses neither more nor less than Celery does.
"""

from __future__ import annotations

import threading

from pikku_celery.mirror.events import ResultStored

__all__ = ["HeldResults"]


class HeldResults:
    """Results held by task id until their attempt's end is handed to the sink."""

    def __init__(self) -> None:
        self._held: dict[str, ResultStored] = {}
        self._taken: set[str] = set()  # handed on by their attempt's end, till the task ran
        self._lock = threading.Lock()

    def hold(self, event: ResultStored) -> None:
        with self._lock:
            self._held[event.step_id] = event

    def take(self, task_id: str) -> ResultStored | None:
        """The result ``task_id`` stored, once; None when none is held."""
        if not self._held:  # the common case, no lock: a task without pikku:// results
            return None
        with self._lock:
            held = self._held.pop(task_id, None)
            if held is not None:
                self._taken.add(task_id)
            return held

    def ran(self, task_id: str) -> tuple[ResultStored | None, bool]:
        """The task has run: the result still held for it (its end handed none on), and
        whether one was handed on before."""
        if not self._held and not self._taken:
            return None, False
        with self._lock:
            held = self._held.pop(task_id, None)
            before = task_id in self._taken
            self._taken.discard(task_id)
            return held, before
