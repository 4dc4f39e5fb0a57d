"""Celery's ``Task.replace``: the replacement takes over the replaced step's task id.

Celery freezes the replacement under the replaced task's id (a lone task keeps
it, a chain gives it to its last link, a group becomes a chord whose
``celery.accumulate`` body gets it), publishes it from inside the replaced
task and ends that task with ``Ignore``. Whatever task ends up with the id
ends the step, so the mirror follows the id: the replacement's messages,
published from inside the step, are searched for the signature that carries
it, and that signature is given the step's headers (its run, its name, the
attempt it continues). That task is then the step, whatever its name (a
``celery.*`` task included), and the replaced attempt is recorded as handed
over to it, never as lost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from celery import current_task

from pikku_celery.integration import headers as h

__all__ = [
    "REPLACED_BY",
    "attempt_of",
    "continued_attempt",
    "continued_from",
    "follow_chord_body",
    "hand_over",
    "is_replacement",
    "successor_headers",
    "takes_over",
]

#: Set on the replaced task's request: the name of the task that took over its id.
REPLACED_BY: Final = "pikku_replaced_by"
# Published by the replaced task for a chord on a backend without native chords; it
# carries the chord's body (the task that gets the id) in its arguments.
_CHORD_UNLOCK: Final = "celery.chord_unlock"
# A chord's or chain's own signature shares the id of the task that gets it.
_CANVAS_TASKS: Final = frozenset({"celery.chord", "celery.chain", "celery.group"})
# Canvases nest, but not this deep; the search stops rather than recurse without end.
_MAX_DEPTH: Final = 64


def continued_attempt(request: Any) -> int | None:
    """The attempt of the step a task took over the id of; None: it took over none.

    The header names the step's id too: a task that merely inherited the
    header (a canvas passes options down) is not the one that took over.
    """
    return continued_from(h.from_request(request, h.REPLACES), getattr(request, "id", None))


def continued_from(value: Any, task_id: Any) -> int | None:
    """:func:`continued_attempt` of a request whose id and ``REPLACES`` header are read."""
    if isinstance(value, list | tuple) and len(value) == 2:
        step_id, attempt = value
        if step_id == task_id:
            return int(attempt)
    return None


def attempt_of(request: Any) -> int:
    """The attempt a running task is: ``retries + 1``, counted on from a replaced step's."""
    base = continued_attempt(request) or 1
    return base + int(getattr(request, "retries", 0) or 0)


def is_replacement(request: Any, headers: Mapping[str, Any], sender: str) -> bool:
    """Whether a message published while ``request`` runs belongs to its replacement."""
    # Celery counts replacements into every message of one; a retry keeps the count.
    own = int(getattr(request, "replaced_task_nesting", 0) or 0)
    return int(headers.get("replaced_task_nesting") or 0) > own or sender == _CHORD_UNLOCK


def takes_over(headers: Mapping[str, Any]) -> bool:
    """Whether a message is of the task that took over a replaced step's id."""
    value = headers.get(h.REPLACES)
    return isinstance(value, list | tuple) and len(value) == 2 and value[0] == headers.get("id")


def successor_headers(request: Any, run_id: str, step_name: str) -> dict[str, Any]:
    """What the task that takes over the step's id carries: it is the step from then on."""
    marks = h.step_headers(
        run_id, step_name, orchestrated=bool(h.from_request(request, h.ORCHESTRATED))
    )
    marks[h.REPLACES] = [str(request.id), attempt_of(request)]
    return marks


def hand_over(step_id: str, headers: dict[str, Any], body: Any, marks: Mapping[str, Any]) -> str:
    """Give ``marks`` to whatever in this message carries ``step_id``; its task's name, or ""."""
    if headers.get("id") == step_id:
        headers.update(marks)
        return str(headers.get("task") or "")
    return _mark(body, step_id, marks, 0)


def follow_chord_body(body: Any, step_name_of: Callable[[Any], str | None]) -> None:
    """A chord kept by a result backend that sends its body itself (no ``chord_unlock``
    from inside a header task): when the running step is being replaced by a group, the
    body Celery gave the step's id is marked before the chord is kept, so the body sent
    later carries the step on. ``step_name_of``: the app's selection of steps."""
    task = current_task._get_current_object() if current_task else None  # type: ignore[attr-defined]
    request = getattr(task, "request", None)
    step_id = getattr(request, "id", None)
    if request is None or step_id is None:
        return
    step_name = h.from_request(request, h.STEP_NAME) or step_name_of(task)
    if step_name is None:
        return  # a task the mirror leaves alone
    run_id = h.from_request(request, h.RUN_ID) or str(step_id)
    marks = successor_headers(request, run_id, str(step_name))
    taken_by = _mark(body, str(step_id), marks, 0)
    if taken_by and not getattr(request, REPLACED_BY, None):
        setattr(request, REPLACED_BY, taken_by)


def _mark(value: Any, step_id: str, marks: Mapping[str, Any], depth: int) -> str:
    if depth > _MAX_DEPTH:
        return ""
    found = ""
    if isinstance(value, dict):
        options = value.get("options")
        task = value.get("task")
        if (
            isinstance(options, dict)
            and options.get("task_id") == step_id
            and isinstance(task, str)
            and task not in _CANVAS_TASKS
        ):
            # Celery sends a signature's ``headers`` option as message headers.
            options["headers"] = {**(options.get("headers") or {}), **marks}
            found = task
        children: Any = value.values()
    elif isinstance(value, list | tuple):
        children = value
    else:
        return ""
    for child in children:
        found = _mark(child, step_id, marks, depth + 1) or found
    return found
