"""What one group commit of the mirror writes: new steps, attempt transitions, run outcomes.

Plain values, already coalesced by the caller (one transition per step and
attempt) and with every JSON value already encoded by the store's codec, so
applying a batch does no serialisation and no per-event work in Python
beyond binding parameters. Knows nothing of Celery.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "BatchResult",
    "ChordWrite",
    "FiredChord",
    "Handover",
    "MirrorBatch",
    "NewStep",
    "ResultWrite",
    "RunOutcome",
    "StepTransition",
]

TRANSITION_STATUSES: Final = frozenset({"scheduled", "running", "succeeded", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class NewStep:
    """A published step: scheduled with attempt 1, under the first free name in its run.

    ``parent_step_id`` is the step it follows, by id: its name is looked up
    when the row is written, so it is right even when the parent got a
    ``#N`` suffix. A ``run_workflow`` makes the step's run too (a lone task).
    """

    run_id: str
    step_id: str
    step_name: str
    rpc_name: str | None
    data_json: str
    at: dt.datetime
    parent_step_id: str | None = None
    from_step_name: str | None = None
    retries: int | None = None
    retry_delay: float | None = None  # seconds
    eta: dt.datetime | None = None
    run_workflow: str | None = None
    run_input_json: str | None = None
    run_wire_json: str | None = None
    #: ``{"exchange": ..., "routing_key": ...}`` of the step's first message, as JSON.
    routing_json: str | None = None
    #: A chord's header task: its body's task id. The run is not done until that step is.
    chord_body: str | None = None


@dataclass(frozen=True, slots=True)
class StepTransition:
    """Attempt ``attempt`` of a step moved on; ``None``: the step's current attempt.

    Several events of one attempt come as one transition: ``status`` is where
    they end, and each ``*_at`` is the time of its own event.
    """

    step_id: str
    attempt: int | None
    status: str
    at: dt.datetime
    scheduled_at: dt.datetime | None = None
    running_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    result_json: str | None = None
    error_json: str | None = None
    task_id: str | None = None
    worker: str | None = None
    pid: int | None = None
    eta: dt.datetime | None = None
    reason: str | None = None
    delivery_ids: tuple[str, ...] = ()
    #: The retries and delay (seconds) the step gets from now on (None: as they were), and
    #: ``gave_up``: Celery will not retry it again, so none remain after this attempt.
    retries: int | None = None
    retry_delay: float | None = None
    gave_up: bool = False


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What a step's end means for its run (found from the step when ``run_id`` is None).

    ``complete``: the run completes if every step of it succeeded. ``failed``
    and ``cancelled`` end a run that is still going. ``replay``: a durable
    workflow's run decides its outcome itself; it is only reported back.
    ``chord_bodies``: the step is a header task of these chords (a chord in a chord's
    header is a part of the outer one), whose bodies Celery will not send now; a run one
    of them holds open (another header task's) fails too.
    """

    step_id: str
    run_id: str | None
    kind: Literal["complete", "failed", "cancelled", "replay"]
    at: dt.datetime
    error_json: str | None = None
    chord_bodies: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Handover:
    """Attempt ``attempt`` of a step was replaced: ``replaced_by`` carries its task id on.

    The attempt stays open until that task ends (Celery's ``Task.replace``); it
    is never lost and never sent again, since its body already ran.
    """

    step_id: str
    attempt: int
    replaced_by: str


@dataclass(frozen=True, slots=True)
class ResultWrite:
    """Celery's result of a task (``backend="pikku://"``), as its serializer encoded it.

    ``attempt``: the attempt that wrote it (None: the row's own, for a revoke sent from
    outside the task). Not tied to a step: any task of the app has one.
    """

    task_id: str
    attempt: int | None
    status: str
    meta: bytes
    at: dt.datetime
    date_done: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class ChordWrite:
    """A chord for the result backend to finish: its header's task ids in order and its
    body as the app's result serializer encoded it. Written before any part's result can
    be (it is journaled before the header is published), or checked as it lands."""

    group_id: str
    parts: tuple[str, ...]
    body: bytes
    at: dt.datetime


@dataclass(frozen=True, slots=True)
class FiredChord:
    """A chord whose header parts all have results: its body, encoded as it was applied,
    and the parts' ids in header order. Claimed once, by the batch that committed it."""

    group_id: str
    body: bytes
    parts: tuple[str, ...]


@dataclass(slots=True)
class MirrorBatch:
    steps: list[NewStep] = field(default_factory=list)
    transitions: list[StepTransition] = field(default_factory=list)
    outcomes: list[RunOutcome] = field(default_factory=list)
    handovers: list[Handover] = field(default_factory=list)
    results: list[ResultWrite] = field(default_factory=list)
    chords: list[ChordWrite] = field(default_factory=list)
    #: Tasks added to chords (``(group_id, task_id)``), after the chord's other parts.
    chord_parts: list[tuple[str, str]] = field(default_factory=list)
    #: Chords whose bodies are out, and when.
    chords_sent: list[tuple[str, dt.datetime]] = field(default_factory=list)

    def __len__(self) -> int:
        return (
            len(self.steps)
            + len(self.transitions)
            + len(self.outcomes)
            + len(self.handovers)
            + len(self.results)
            + len(self.chords)
            + len(self.chord_parts)
            + len(self.chords_sent)
        )


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What a committed batch did.

    ``missing``: steps named by a transition or outcome (or the parent of a
    new step) that are not in the database; nothing of theirs was written.
    ``replay``: durable-workflow runs whose step ended, to replay now that
    it is committed. ``fired``: chords whose bodies are to be sent now.
    """

    missing: frozenset[str]
    replay: tuple[str, ...]
    fired: tuple[FiredChord, ...] = ()
