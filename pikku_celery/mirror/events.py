"""The mirror's events: what a signal handler saw, as typed values that fit in the journal.

Every event has an id (unique across processes and machines) and the time it
happened, which becomes its row's timestamp however late the row is written.
Values bound for JSON columns travel already encoded (``*_json``): they were
checked by the store's codec when the event was made, so a value that cannot
be stored is replaced by a marked placeholder before anything is journaled.

The events are msgspec Structs, encoded and decoded by msgspec's compiled JSON codec:
a pool process makes and encodes several per task, and the flusher decodes every one
(``python -m bench.event_codec``: about six times faster than dataclasses through the
standard library's ``json``).
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import os
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Final, TypeVar

import msgspec

from pikku_celery.mirror.forks import ForkGuard

__all__ = [
    "Adoption",
    "AttemptEnded",
    "AttemptReplaced",
    "AttemptRetried",
    "AttemptStarted",
    "AttemptSucceeded",
    "ChordApplied",
    "ChordExtended",
    "ChordSent",
    "MirrorEvent",
    "ResultStored",
    "StepDispatched",
    "StepPublished",
    "chord_applied",
    "chord_extended",
    "chord_sent",
    "decode",
    "encode",
    "encode_bytes",
    "make",
    "new_event_id",
    "result_stored",
]


class _EventIds:
    """Ids made of a random per-process prefix and a counter: unique and cheap."""

    def __init__(self) -> None:
        self._reset()
        self._fork = ForkGuard(self._reset)  # a child's ids get a prefix of their own

    def _reset(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        self._fork.check()
        # One C call: atomic under the interpreter lock, no lock of its own needed.
        return f"{self._prefix}-{next(self._counter)}"


_IDS: Final = _EventIds()


def new_event_id() -> str:
    return _IDS.next()


class MirrorEvent(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Frozen and compared by value, as every event below (each says ``frozen`` again for
    type checkers; msgspec would inherit it)."""

    kind: ClassVar[str] = ""
    id: str
    at: float  # seconds since the epoch
    step_id: str


class StepPublished(MirrorEvent, frozen=True):
    """A step's message was sent: it is ``scheduled``, attempt 1.

    ``parent_step_id``: the step it follows (a chain's previous link, the step
    that published it), by id; ``new_run``: (workflow, input JSON, wire JSON)
    of the run a lone task makes; ``routing_json``: where the message went;
    ``chord_body``: the task id of the body of the chord whose header it is in.
    """

    kind: ClassVar[str] = "published"
    run_id: str
    step_name: str
    rpc_name: str
    data_json: str
    parent_step_id: str | None = None
    retries: int | None = None
    retry_delay: float | None = None  # seconds
    eta: float | None = None
    new_run: tuple[str, str, str | None] | None = None
    routing_json: str | None = None
    chord_body: str | None = None


class Adoption(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a worker knows of a step it runs, to record the step itself from its message.

    ``published``: the worker's events wait for the publisher's journal first (a step
    of a run the publisher makes of more than this step: a chain's link, a canvas's
    part). False for a message no pikku-celery publisher sent, and for a lone task,
    whose run is the step alone: the worker records both from the message at once,
    as the publisher would (its input, ``sent_at``, ``eta``, ``chord_body``), and the
    publisher's own record, whenever it lands, changes nothing.
    """

    run_id: str
    step_name: str
    rpc_name: str
    published: bool
    data_json: str | None = None
    retries: int | None = None
    retry_delay: float | None = None  # seconds
    routing_json: str | None = None
    sent_at: float | None = None
    eta: float | None = None
    chord_body: str | None = None


class AttemptStarted(MirrorEvent, frozen=True):
    """Attempt K runs (one delivery of it)."""

    kind: ClassVar[str] = "started"
    attempt: int
    worker: str | None
    pid: int
    adoption: Adoption | None = None
    #: False for the task that took over a replaced attempt: the same delivery goes on.
    delivery: bool = True


class AttemptRetried(MirrorEvent, frozen=True):
    """Attempt K failed and attempt K+1 is scheduled (at ``eta``)."""

    kind: ClassVar[str] = "retried"
    attempt: int
    error_json: str
    eta: float | None = None
    #: What the step gets from now on: Celery's max_retries, and this retry's delay (seconds).
    retries: int | None = None
    retry_delay: float | None = None


class AttemptSucceeded(MirrorEvent, frozen=True):
    """Attempt K succeeded. ``orchestrated``: a durable workflow's step, which replays its run."""

    kind: ClassVar[str] = "succeeded"
    attempt: int
    run_id: str | None
    result_json: str
    orchestrated: bool = False


class AttemptEnded(MirrorEvent, frozen=True):
    """Attempt K ended for good, ``failed`` or ``cancelled``.

    ``attempt``/``run_id`` are None when Celery said so from the worker's main
    process, which does not know them (a rejected message, a hard time limit):
    the step's current attempt and its run are meant.
    """

    kind: ClassVar[str] = "ended"
    attempt: int | None
    run_id: str | None
    status: str
    error_json: str
    orchestrated: bool = False
    #: The bodies of the chords whose header the task is in, innermost first (a chord in
    #: a chord's header is a part of the outer one): Celery will never send them now.
    chord_bodies: tuple[str, ...] = ()


class AttemptReplaced(MirrorEvent, frozen=True):
    """Attempt K's body replaced itself (``Task.replace``): task ``replaced_by`` now carries
    the step's task id, and the attempt ends when that task does."""

    kind: ClassVar[str] = "replaced"
    attempt: int
    replaced_by: str


class ResultStored(MirrorEvent, frozen=True):
    """Celery's result backend stored a task's state (``backend="pikku://"``);
    ``step_id`` is the task id, a step's or not.

    ``meta_b64``: the meta as the app's result serializer encoded it, in base64 so any
    serializer's bytes fit in a journal line; ``attempt``: the attempt that wrote it
    (None: the row's own, for a revoke sent from outside the task).
    """

    kind: ClassVar[str] = "result"
    attempt: int | None
    state: str
    meta_b64: str
    date_done: float | None = None


class ChordApplied(MirrorEvent, frozen=True):
    """A chord for ``backend="pikku://"`` to finish, journaled before its header is
    published; ``step_id`` is the chord's id (its header's group id).

    ``parts``: the header's task ids in order; ``body_b64``: the body's signature as the
    app's result serializer encoded it, in base64.
    """

    kind: ClassVar[str] = "chord"
    parts: tuple[str, ...]
    body_b64: str


class ChordExtended(MirrorEvent, frozen=True):
    """A header task added task ``part`` to its chord (``Task.add_to_chord``), journaled
    before that task is published; ``step_id`` is the chord's id."""

    kind: ClassVar[str] = "chord_extended"
    part: str


class ChordSent(MirrorEvent, frozen=True):
    """The body of a fired chord is out (or failed with ``ChordError``): it is never sent
    again. ``step_id`` is the chord's id."""

    kind: ClassVar[str] = "chord_sent"


class StepDispatched(MirrorEvent, frozen=True):
    """The message of a step that a replay claimed in SQL is out (attempt K).

    Until this is in SQL, a claimed step may be one whose replay died between
    the claim and the publish; the reaper sends such a step once it is overdue.
    """

    kind: ClassVar[str] = "dispatched"
    attempt: int


_KINDS: Final[dict[str, type[MirrorEvent]]] = {
    cls.kind: cls
    for cls in (
        StepPublished,
        StepDispatched,
        AttemptStarted,
        AttemptRetried,
        AttemptSucceeded,
        AttemptEnded,
        AttemptReplaced,
        ResultStored,
        ChordApplied,
        ChordSent,
        ChordExtended,
    )
}
_ENCODER: Final = msgspec.json.Encoder()
_DECODERS: Final = {kind: msgspec.json.Decoder(cls) for kind, cls in _KINDS.items()}


def encode(event: MirrorEvent) -> str:
    """The event as one line of JSON (an object of its fields), for the journal."""
    return _ENCODER.encode(event).decode()


def encode_bytes(event: MirrorEvent) -> bytes:
    """:func:`encode` as UTF-8, as the journal's record holds it (no decoding and
    encoding again on the way)."""
    return _ENCODER.encode(event)


def decode(kind: str, payload: str) -> MirrorEvent:
    """The event a journal line holds; ``ValueError`` if it is not one."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ValueError(f"unknown mirror event kind {kind!r}")
    try:
        event: MirrorEvent = decoder.decode(payload)
    except msgspec.DecodeError as exc:  # ValidationError included: the wrong fields
        raise ValueError(f"not a {kind} event: {exc}") from exc
    return event


_E = TypeVar("_E", bound=MirrorEvent)


def make(kind: type[_E], step_id: str, at: float | None = None, **fields: Any) -> _E:
    """The one way an event is made: a new id, and the time it happened (default now)."""
    return kind(id=new_event_id(), at=time.time() if at is None else at, step_id=step_id, **fields)


def result_stored(
    task_id: str, attempt: int | None, state: str, meta: bytes, date_done: dt.datetime | None
) -> ResultStored:
    """Celery's result backend stored a task's state (``backend="pikku://"``)."""
    return make(
        ResultStored,
        task_id,
        attempt=attempt,
        state=state,
        meta_b64=base64.b64encode(meta).decode("ascii"),
        date_done=None if date_done is None else date_done.timestamp(),
    )


def chord_applied(group_id: str, parts: Sequence[str], body: bytes) -> ChordApplied:
    """A chord for ``backend="pikku://"`` to finish, before its header is published."""
    return make(
        ChordApplied, group_id, parts=tuple(parts), body_b64=base64.b64encode(body).decode("ascii")
    )


def chord_extended(group_id: str, part: str) -> ChordExtended:
    """A header task added task ``part`` to its chord, before publishing it."""
    return make(ChordExtended, group_id, part=part)


def chord_sent(group_id: str) -> ChordSent:
    """A fired chord's body is out: the reaper never sends it again."""
    return make(ChordSent, group_id)
