"""Chords the pikku result backend finishes itself: no ``celery.chord_unlock`` task
polling once a second per open chord.

``apply_chord`` keeps the chord in SQL (its body and its header parts, in order)
before any header task is published. The batch that writes the last of the parts'
results claims the firing, once, in its own transaction; once it has committed,
the process that wrote it sends the body with the header's results in header order,
read in one query, or fails it with ``ChordError`` and runs its errbacks when a
part failed, as Celery's own backends do.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from celery import states
from celery.canvas import maybe_signature
from celery.exceptions import ChordError
from celery.result import AsyncResult, GroupResult, ResultBase

from pikku_celery.errors import StepNotFound
from pikku_celery.integration.run_context import RunContext, current_run
from pikku_celery.store import FiredChord

__all__ = ["chord_parts", "fire_chords"]

logger = logging.getLogger(__name__)


def chord_parts(header: ResultBase) -> list[str]:
    """The task ids whose results complete a chord, in header order: a nested group's
    tasks one by one, a chain or a nested chord by its last task (the one Celery gives
    the chord to)."""
    if isinstance(header, GroupResult):
        return [task_id for child in header.results or () for task_id in chord_parts(child)]
    if isinstance(header, AsyncResult):
        return [str(header.id)]
    return []


def fire_chords(backend: Any, chords: Iterable[FiredChord]) -> None:
    """Send each chord's body, or fail it; a chord's failure never stops the others."""
    for chord in chords:
        try:
            _fire(backend, chord)
        except Exception:
            logger.exception(
                "pikku-celery could not send the body of chord %s",
                chord.group_id,
                extra={"action": "chord_fire_failed", "group_id": chord.group_id},
            )


def _fire(backend: Any, chord: FiredChord) -> None:
    app = backend.app
    body = maybe_signature(backend.decode(chord.body), app=app)
    if body is None:
        raise ValueError(f"chord {chord.group_id} has no body")
    stored = backend.store.results.get_many(chord.parts)
    metas: Sequence[dict[str, Any]] = [
        backend.decode_result(stored[task_id].meta) for task_id in chord.parts
    ]
    for task_id, meta in zip(chord.parts, metas, strict=True):
        if meta["status"] in states.PROPAGATE_STATES:
            culprit = meta["result"]
            cause = culprit if isinstance(culprit, BaseException) else None
            # Celery fails the body "from the current stack": it needs one being handled.
            try:
                raise ChordError(f"Dependency {task_id} raised {culprit!r}") from cause
            except ChordError as error:
                backend.chord_error_from_stack(body, error)
            return
    # The body joins the run of the last header part, after that part, as it does when
    # Celery's own backends send it from inside that task.
    context = None
    with contextlib.suppress(StepNotFound):
        last = backend.store.get_step(chord.parts[-1])
        context = RunContext(last.run_id, last.step_id)
    token = current_run.set(context)
    try:
        body.delay([meta["result"] for meta in metas])
    finally:
        current_run.reset(token)
