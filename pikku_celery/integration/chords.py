"""Chords the pikku result backend finishes itself: no ``celery.chord_unlock`` task
polling once a second per open chord.

``apply_chord`` keeps the chord in SQL (its body and its header parts, in order)
before any header task is published. The batch that writes the last of the parts'
results claims the firing, once, in its own transaction; once it has committed,
the process that wrote it sends the body with the header's results in header order,
read in one query, or fails it with ``ChordError`` and runs its errbacks when a
part failed, as Celery's own backends do, and journals that the body is out. The
reaper fires what no batch could and sends again a body that was claimed and never
said sent: at least once, under the body's frozen task id.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, Protocol

from celery import _state, states
from celery.canvas import group, maybe_signature
from celery.exceptions import ChordError
from celery.result import AsyncResult, GroupResult, ResultBase, result_from_tuple

from pikku_celery.errors import StepNotFound
from pikku_celery.integration.run_context import RunContext, current_run
from pikku_celery.store import FiredChord, WorkflowStore, now

__all__ = [
    "RESEND_AFTER",
    "SHAPE_OPTION",
    "ChordBackend",
    "chord_parts",
    "fire_chords",
    "header_shape",
    "resume_chords",
]

logger = logging.getLogger(__name__)

#: Seconds after its firing was claimed that a chord never said sent is sent again
#: (``pikku_chord_resend_after``): its sent mark travels the journal of the process that
#: sent it, so this is well past that journal's flush lag.
RESEND_AFTER: Final = 30.0
#: The body's option that holds the header's shape (``header_shape``) while it is kept.
SHAPE_OPTION: Final = "pikku_header_shape"
# Seconds a chord whose parts are all done may wait for a batch to fire it.
_DUE_AFTER: Final = 5.0


class ChordBackend(Protocol):
    """What firing a chord needs of the result backend (``PikkuBackend`` has it)."""

    app: Any

    @property
    def store(self) -> WorkflowStore: ...

    def decode(self, payload: Any) -> Any: ...

    def decode_result(self, payload: Any) -> Any: ...

    def chord_error_from_stack(self, callback: Any, exc: Any = None) -> Any: ...

    def fire_chords(self, chords: Sequence[FiredChord]) -> None: ...


def header_shape(header: GroupResult) -> Any | None:
    """How the body's argument nests, when it does (a header holding a chain that ends in a
    group: that group's results are one value); None when it is one value per part.

    Kept in the body's options as Celery's Redis backend keeps the header's result tuple
    for the same headers, and taken off before the body is sent."""
    if any(isinstance(child, GroupResult) for child in header.results or ()):
        return header.as_tuple()
    return None


def chord_parts(header: ResultBase) -> list[str]:
    """The task ids whose results complete a chord, in header order: a nested group's
    tasks one by one, a chain or a nested chord by its last task (the one Celery gives
    the chord to)."""
    if isinstance(header, GroupResult):
        return [task_id for child in header.results or () for task_id in chord_parts(child)]
    if isinstance(header, AsyncResult):
        return [str(header.id)]
    return []


def fire_chords(
    backend: ChordBackend, chords: Iterable[FiredChord], sent: Callable[[str], object]
) -> None:
    """Send each chord's body, or fail it, then tell ``sent`` its id; a chord's failure
    never stops the others, and one not told is sent again by the reaper."""
    for chord in chords:
        try:
            _fire(backend, chord)
        except Exception:
            logger.exception(
                "pikku-celery could not send the body of chord %s; the reaper sends it again",
                chord.group_id,
                extra={"action": "chord_fire_failed", "group_id": chord.group_id},
            )
        else:
            sent(chord.group_id)


def resume_chords(backend: ChordBackend, *, resend_after: float) -> int:
    """The reaper's part: fire the chords whose firing no batch claimed (the chord and its
    last result landed at once, in two transactions), and send again the bodies of chords
    claimed ``resend_after`` seconds ago and never said sent (the process that claimed one
    died between its COMMIT and the publish). Returns how many it fired."""
    results = backend.store.results
    at = now()
    due = results.finish_due_chords(at - dt.timedelta(seconds=_DUE_AFTER))
    unsent = results.unsent_chords(at - dt.timedelta(seconds=resend_after))
    for chord in unsent:
        logger.warning(
            "pikku-celery sends the body of chord %s again: it was claimed %s and never said sent",
            chord.group_id,
            f"over {resend_after:g} s ago",
            extra={"action": "chord_resent", "group_id": chord.group_id},
        )
    chords = [*due, *unsent]
    if chords:
        backend.fire_chords(chords)
    return len(chords)


@contextlib.contextmanager
def _current(app: Any) -> Iterator[None]:
    """``app`` as this thread's current app, for as long as a chord fires.

    Celery binds the links of a chain decoded from a kept body to the thread's current
    app, not to the app it was decoded with; a flusher or reaper thread's current app is
    Celery's default, which has no broker, so the links would go to ``localhost``.
    """
    before = _state._tls.current_app  # type: ignore[attr-defined]  # no public getter
    app.set_current()
    try:
        yield
    finally:
        _state._set_current_app(before)  # type: ignore[attr-defined]


def _fire(backend: ChordBackend, chord: FiredChord) -> None:
    with _current(backend.app):
        _send(backend, chord)


def _send(backend: ChordBackend, chord: FiredChord) -> None:
    app = backend.app
    body = maybe_signature(backend.decode(chord.body), app=app)
    if body is None:
        raise ValueError(f"chord {chord.group_id} has no body")
    shape = body.options.pop(SHAPE_OPTION, None)
    stored = backend.store.results.get_many(chord.parts)
    metas: Sequence[dict[str, Any]] = [
        backend.decode_result(stored[task_id].meta) for task_id in chord.parts
    ]
    for task_id, meta in zip(chord.parts, metas, strict=True):
        if meta["status"] in states.PROPAGATE_STATES:
            culprit = meta["result"]
            cause = culprit if isinstance(culprit, BaseException) else None
            # Celery fails the body "from the current stack": it needs one being handled.
            if isinstance(culprit, ChordError):
                # The part is the body of a chord in this one's header, failed by its own
                # header: its errbacks, which Celery gives it from this chord's, ran then.
                # Celery's Redis backend never counts such a part, so they never run twice.
                body = _without_errbacks(body, app)
            try:
                raise ChordError(f"Dependency {task_id} raised {culprit!r}") from cause
            except ChordError as error:
                backend.chord_error_from_stack(body, error)
            return
    # Sent as Celery's own backends send it, from inside the header task that completed
    # the chord (here the last in header order): that task is its parent, that task's root
    # is its root (a header task sent from outside any task is a root itself), and it
    # joins that task's run, after that task.
    last_part = chord.parts[-1]
    root = body.options.get("root_id") or last_part
    context = None
    with contextlib.suppress(StepNotFound):
        last = backend.store.get_step(last_part)
        context = RunContext(last.run_id, last.step_id)
    token = current_run.set(context)
    try:
        values = [meta["result"] for meta in metas]
        if shape is not None:
            by_id = dict(zip(chord.parts, values, strict=True))
            values = _nested(result_from_tuple(shape, app), by_id)
        body.apply_async((values,), parent_id=last_part, root_id=root)
    finally:
        current_run.reset(token)


def _nested(header: ResultBase, values: dict[str, Any]) -> Any:
    """The header's results shaped as ``GroupResult.join`` gives them: a list per group."""
    if isinstance(header, GroupResult):
        return [_nested(child, values) for child in header.results or ()]
    if isinstance(header, AsyncResult):
        return values[str(header.id)]
    return None


def _without_errbacks(body: Any, app: Any) -> Any:
    """A copy of ``body`` (and of the tasks of a group body) with no errbacks."""
    quiet = body.clone()
    quiet.options.pop("link_error", None)
    if isinstance(quiet, group):
        tasks = [_without_errbacks(maybe_signature(t, app=app), app) for t in quiet.tasks]
        quiet.kwargs["tasks"] = tasks
    return quiet
