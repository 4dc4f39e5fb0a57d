"""Where ``backend="pikku://"`` hands its results and chords: one of two sinks, chosen once.

In a process where a ``PikkuCelery`` records the app (a worker, a publisher),
:class:`Journaled` hands each result to the recorder: a task's own end waits
behind its attempt's end, a state stored within a task is journaled (no
database round trip on a task's path), and a state stored outside any task
(a revoke, a chord's error) is in SQL when ``store_result`` returns, or
journaled while the database is away. In a process that only stores results
(no ``PikkuCelery`` on the app), :class:`Direct` writes each at once. The
backend chooses one per installation and process, in one place
(``PikkuBackend._sink``), and never asks again.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from pikku_celery.errors import SchemaNotCurrent, StoreError, Transient
from pikku_celery.integration.installed import Installed
from pikku_celery.mirror import AfterCommit, ChordsFired, DirectSink, MirrorEvent, ResultStored
from pikku_celery.store import WorkflowStore

__all__ = ["Direct", "Journaled", "ResultSink"]

logger = logging.getLogger(__name__)


class ResultSink(Protocol):
    """What the result backend writes through."""

    @property
    def store(self) -> WorkflowStore: ...

    def result(self, event: ResultStored, *, held: bool, in_task: bool) -> None:
        """A task's state: ``held``, stored by the end of the task running here (it follows
        that attempt's end); ``in_task``, stored within a task (journaled with its events)."""

    def chord(self, event: MirrorEvent) -> None:
        """A chord applied, extended or sent."""

    def adopted(self) -> bool:
        """The journals of this node's dead pool processes written now; False when this
        process has none to write (only a worker's main process has)."""

    def step_name(self, task: Any) -> str | None:
        """The step name of a task the mirror records; None for one it does not."""


class Journaled:
    """Through the recorder of the ``PikkuCelery`` installed on the app."""

    def __init__(self, pikku: Installed) -> None:
        self._pikku = pikku
        self._recorder = pikku.mirror

    @property
    def store(self) -> WorkflowStore:
        return self._recorder.store

    def result(self, event: ResultStored, *, held: bool, in_task: bool) -> None:
        if held:
            self._recorder.result_after_attempt(event)
        elif in_task:
            # With the events of that task or of the task running here (the worker's main
            # process failing a rejected task, the later links of a failed chain).
            self._recorder.append(event)
        else:
            self._now(event)

    def _now(self, event: ResultStored) -> None:
        """A state stored outside any task has no attempt to wait behind: it is in SQL when
        ``store_result`` returns, so whoever reads next sees it. With the database away it
        is journaled instead, written once it is back; the caller is not failed for it."""
        try:
            self._recorder.direct.append(event)
        except StoreError as exc:
            if not isinstance(exc, Transient | SchemaNotCurrent):
                raise
            logger.info(
                "pikku-celery journals the %s state of task %s to write it later: %s",
                event.state,
                event.step_id,
                exc,
                extra={"action": "result_journaled", "task_id": event.step_id},
            )
            self._recorder.append(event)

    def chord(self, event: MirrorEvent) -> None:
        # Journaled like a result: publishing a chord needs no database round trip, and
        # its header's results may reach SQL first (other processes' journals).
        self._recorder.append(event)

    def adopted(self) -> bool:
        if not self._pikku.runs_upkeep:
            return False
        # Returns once no adoption of this process is under way (the flusher's may have
        # taken the journal first): what it wrote is committed by then.
        self._recorder.adopt_orphans()
        return True

    def step_name(self, task: Any) -> str | None:
        return self._pikku.selection.step_name(task)


class Direct:
    """Straight to the store: a process with no recorder; the chords a write completes
    are handed to ``fire`` after its COMMIT."""

    def __init__(self, store: WorkflowStore, fire: ChordsFired) -> None:
        self._store = store
        after = AfterCommit()
        after.on_chords_fired(fire)
        self._sink = DirectSink(store, after)

    @property
    def store(self) -> WorkflowStore:
        return self._store

    def result(self, event: ResultStored, *, held: bool, in_task: bool) -> None:
        self._sink.append(event)

    def chord(self, event: MirrorEvent) -> None:
        self._sink.append(event)

    def adopted(self) -> bool:
        return False

    def step_name(self, task: Any) -> str | None:
        return None  # no PikkuCelery here: no task is a step
