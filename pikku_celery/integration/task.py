"""``WorkflowTask``: the Celery base class that makes a task a step of a run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task

from pikku_celery.errors import StoreUnavailable
from pikku_celery.integration import headers as h
from pikku_celery.integration.installed import finished_result

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    _TaskBase = Task[Any, Any]
else:
    _TaskBase = Task

__all__ = [
    "WorkflowTask",
    "as_task_function",
    "default_step_name",
    "retry_policy",
]


def retry_policy(task: Any) -> tuple[int | None, float | None]:
    """The retries and delay a task's step gets from Celery by itself: autoretry's
    ``max_retries`` (None: for ever) and ``default_retry_delay``; none for a task that does
    not autoretry. A task's own ``self.retry()`` updates its step when it retries."""
    if getattr(task, "autoretry_for", ()):
        return task.max_retries, task.default_retry_delay
    return 0, None


def default_step_name(task_name: str) -> str:
    """A task's step name in runs unless it says otherwise: the last part of its name."""
    return task_name.rsplit(".", 1)[-1]


class WorkflowTask(_TaskBase):
    """Base class for tasks whose every attempt is mirrored into SQL.

    Use it as ``@app.task(base=WorkflowTask)`` or through ``@pikku.step()``.
    It adds no behaviour to the task itself: the mirror listens to Celery's
    signals and records tasks of this class (every task, under
    ``PikkuCelery(app, mirror="all")``), so a failing mirror can never change
    what the task does.
    """

    #: The step name in runs; defaults to the last part of the task's name.
    pikku_step_name: ClassVar[str | None] = None

    @classmethod
    def step_name_for(cls, task_name: str) -> str:
        return cls.pikku_step_name or default_step_name(task_name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if getattr(request, "id", None) and h.from_request(request, h.ORCHESTRATED):
            # A workflow step dispatched twice (a replay crashed between sending
            # it and recording that) must not do its work twice.
            try:
                done, result = finished_result(self.app, str(request.id))
            except StoreUnavailable as exc:
                # A database outage must not fail the step: its events wait in the journal,
                # and a step Celery delivers is run at least once, as Celery runs any task.
                logger.warning(
                    "pikku-celery could not check whether step %s already succeeded (%s); "
                    "running it",
                    request.id,
                    exc,
                    extra={"action": "duplicate_check_skipped"},
                )
                done, result = False, None
            if done:
                return result
        if not request.called_directly:
            # Traced (a worker, apply(), an embedded or inline worker): the tracer has pushed
            # this request; run the body under it, as Celery runs a task without a __call__ of
            # its own. Task.__call__ pushes another request, which before Celery 5.5 is empty
            # outside a `celery worker` process: no id, and retry() raised instead of retrying.
            return self.run(*args, **kwargs)
        return super().__call__(*args, **kwargs)


def as_task_function(method: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function calling ``method``, to register a bound method as a Celery task.

    Celery reads a task's signature to check the arguments of ``apply_async``
    (beat, ``delay``); a bound method's signature would count ``self``.
    """

    def task(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    task.__name__ = task.__qualname__ = method.__name__.lstrip("_")
    task.__doc__ = method.__doc__
    return task
