"""``WorkflowTask``: the Celery base class that makes a task a step of a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task

if TYPE_CHECKING:
    _TaskBase = Task[Any, Any]
else:
    _TaskBase = Task

__all__ = ["WorkflowTask"]


class WorkflowTask(_TaskBase):
    """Base class for tasks whose every attempt is mirrored into SQL.

    Use it as ``@app.task(base=WorkflowTask)`` or through ``@pikku.step()``.
    It adds no behaviour to the task itself: the mirror listens to Celery's
    signals and records only tasks of this class, so a failing mirror can never
    change what the task does.
    """

    #: The step name in runs; defaults to the last part of the task's name.
    pikku_step_name: ClassVar[str | None] = None

    @classmethod
    def step_name_for(cls, task_name: str) -> str:
        return cls.pikku_step_name or task_name.rsplit(".", 1)[-1]
