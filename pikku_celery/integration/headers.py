"""The message headers that carry a step's identity from publisher to worker and on to children.

Celery copies custom headers onto ``task.request`` and keeps them when a task
retries, so a retried message still knows its run and step.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "ORCHESTRATED",
    "PARENT_STEP",
    "REPLACES",
    "RUN_ID",
    "SENT_AT",
    "STEP_NAME",
    "fields_of",
    "from_request",
    "step_headers",
    "step_message",
]

RUN_ID: Final = "pikku_run_id"
# The step's name in its run, as the mirror assigned it (or as the user chose it).
STEP_NAME: Final = "pikku_step"
# For a task that is not a step (a chord's unlock task): the step its children follow.
PARENT_STEP: Final = "pikku_parent_step"
# Set when a durable workflow's replay dispatched the step: its end replays the run.
ORCHESTRATED: Final = "pikku_orchestrated"
# On the task that took over a replaced step's task id (Celery's ``Task.replace``):
# [step id, the attempt of that step it continues]. Its own retries count on from there.
REPLACES: Final = "pikku_replaces"
# When the publisher sent a step's message (seconds since the epoch): a worker that records
# the step before the publisher's journal is written gives it the same time.
SENT_AT: Final = "pikku_sent_at"
_NAMES: Final = (RUN_ID, STEP_NAME, PARENT_STEP, ORCHESTRATED, REPLACES, SENT_AT)


def from_request(request: Any, name: str) -> Any:
    """A pikku header of a running task's request, or None."""
    value = getattr(request, name, None)
    if value is None:
        headers = getattr(request, "headers", None) or {}
        value = headers.get(name)
    return value


def fields_of(request: Any) -> dict[str, Any]:
    """A running task's pikku headers, read in one pass: ``from_request`` for each of them.

    Celery sets a message's headers as attributes of its request (``request.__dict__``);
    a request made otherwise may carry them in ``request.headers`` instead."""
    own = getattr(request, "__dict__", None)
    if own is None:
        return {name: v for name in _NAMES if (v := from_request(request, name)) is not None}
    headers = own.get("headers") or getattr(request, "headers", None) or {}
    found = {}
    for name in _NAMES:
        value = own.get(name)
        if value is None:
            value = headers.get(name)
        if value is not None:
            found[name] = value
    return found


def step_headers(run_id: str, step_name: str, *, orchestrated: bool) -> dict[str, Any]:
    """The headers that make a message the step ``step_name`` of run ``run_id``;
    ``orchestrated``: a durable workflow's step, whose end replays its run."""
    headers: dict[str, Any] = {RUN_ID: run_id, STEP_NAME: step_name}
    if orchestrated:
        headers[ORCHESTRATED] = True
    return headers


def step_message(
    run_id: str, step_id: str, step_name: str, attempt: int, *, orchestrated: bool
) -> dict[str, Any]:
    """The options (``apply_async``'s, ``send_task``'s) of a message that sends attempt
    ``attempt`` of a step recorded already: its task id is the step's id, and ``retries``
    makes the worker's ``request.retries + 1`` the attempt the store expects."""
    return {
        "task_id": step_id,
        "retries": attempt - 1,
        "headers": step_headers(run_id, step_name, orchestrated=orchestrated),
    }
