"""From journaled events to one store batch: where a Celery retry becomes an attempt row.

Events of the same attempt in one batch are coalesced into one transition
(a task that finished before its ``running`` event was flushed is written
once, as succeeded, with both times). Which rows an event moves:

- ``StepPublished``: a new step, scheduled, attempt 1 (and the run of a lone task);
- ``StepDispatched``: a claimed step's message is out: its attempt gets its task id;
- ``AttemptStarted``: attempt K running, one delivery counted by event id;
- ``AttemptRetried``: attempt K failed and attempt K+1 scheduled;
- ``AttemptSucceeded``: attempt K succeeded; its run completes if it was the last;
- ``AttemptEnded``: attempt K failed or cancelled, and so does its run;
- ``AttemptReplaced``: attempt K handed its task id to its replacement, with whose end it ends;
- ``ResultStored``: Celery's view of a task, for ``backend="pikku://"``, written with the
  attempt it belongs to;
- ``ChordApplied``: a chord for ``backend="pikku://"`` to finish, written before its parts;
- ``ChordExtended``: a header task added a task to its chord (``Task.add_to_chord``);
- ``ChordSent``: a fired chord's body is out, and is never sent again.

A step a worker ran that no publisher recorded is adopted: at once when the
message came from a process without pikku-celery, after ``grace`` seconds
when its publisher's event should have come first.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pikku_celery.mirror.events import (
    Adoption,
    AttemptEnded,
    AttemptReplaced,
    AttemptRetried,
    AttemptStarted,
    AttemptSucceeded,
    ChordApplied,
    ChordExtended,
    ChordSent,
    MirrorEvent,
    ResultStored,
    StepDispatched,
    StepPublished,
)
from pikku_celery.mirror.ordering import adopts, parent_link
from pikku_celery.store import (
    NEXT_ATTEMPT_GAP,
    STATUS_RANK,
    ChordWrite,
    Handover,
    MirrorBatch,
    NewStep,
    ResultWrite,
    RunOutcome,
    StepTransition,
)

__all__ = ["Pending", "plan"]

_LONE_TASK_WIRE: Final = '{"type":"task"}'
_GAP: Final = NEXT_ATTEMPT_GAP.total_seconds()


@dataclass(frozen=True, slots=True)
class Pending:
    """One journaled event on its way to SQL; ``overdue``: it has waited past its grace."""

    seq: int
    event: MirrorEvent
    overdue: bool = False


def moment(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc)


@dataclass(slots=True)
class _Attempt:
    """The events of one attempt in a batch, folded in the order they happened."""

    step_id: str
    attempt: int | None
    status: str = "scheduled"
    at: float = 0.0
    scheduled_at: float | None = None
    running_at: float | None = None
    ended_at: float | None = None
    result_json: str | None = None
    error_json: str | None = None
    task_id: str | None = None
    worker: str | None = None
    pid: int | None = None
    eta: float | None = None
    reason: str | None = None
    delivery_ids: list[str] = field(default_factory=list)
    seen: bool = False
    retries: int | None = None
    retry_delay: float | None = None
    gave_up: bool = False

    def move(self, status: str, at: float) -> bool:
        """Fold one event in; True when it moves the attempt forward (as SQL's guard would)."""
        self.at = max(self.at, at)
        if self.seen and STATUS_RANK[status] <= STATUS_RANK[self.status]:
            return False
        self.status, self.seen = status, True
        return True

    def transition(self) -> StepTransition:
        return StepTransition(
            step_id=self.step_id,
            attempt=self.attempt,
            status=self.status,
            at=moment(self.at),
            scheduled_at=_maybe(self.scheduled_at),
            running_at=_maybe(self.running_at),
            ended_at=_maybe(self.ended_at),
            result_json=self.result_json,
            error_json=self.error_json,
            task_id=self.task_id,
            worker=self.worker,
            pid=self.pid,
            eta=_maybe(self.eta),
            reason=self.reason,
            delivery_ids=tuple(self.delivery_ids),
            retries=self.retries,
            retry_delay=self.retry_delay,
            gave_up=self.gave_up,
        )


def _maybe(seconds: float | None) -> dt.datetime | None:
    return None if seconds is None else moment(seconds)


class _Planner:
    def __init__(self) -> None:
        self.batch = MirrorBatch()
        self._attempts: dict[tuple[str, int | None], _Attempt] = {}

    def attempt(self, step_id: str, attempt: int | None) -> _Attempt:
        key = (step_id, attempt)
        found = self._attempts.get(key)
        if found is None:
            found = self._attempts[key] = _Attempt(step_id, attempt)
        return found

    def published(self, event: StepPublished, overdue: bool) -> None:
        run = event.new_run
        self.batch.steps.append(
            NewStep(
                run_id=event.run_id,
                step_id=event.step_id,
                step_name=event.step_name,
                rpc_name=event.rpc_name,
                data_json=event.data_json,
                at=moment(event.at),
                parent_step_id=parent_link(event, overdue),
                retries=event.retries,
                retry_delay=event.retry_delay,
                eta=_maybe(event.eta),
                run_workflow=None if run is None else run[0],
                run_input_json=None if run is None else run[1],
                run_wire_json=None if run is None else run[2],
                routing_json=event.routing_json,
                chord_body=event.chord_body,
            )
        )

    def adopt(self, event: AttemptStarted, adoption: Adoption) -> None:
        lone = adoption.run_id == event.step_id
        data = adoption.data_json or "null"
        self.batch.steps.append(
            NewStep(
                run_id=adoption.run_id,
                step_id=event.step_id,
                step_name=adoption.step_name,
                rpc_name=adoption.rpc_name,
                data_json=data,
                # The time the message was sent, as its publisher records it.
                at=moment(adoption.sent_at or event.at),
                retries=adoption.retries,
                retry_delay=adoption.retry_delay,
                eta=_maybe(adoption.eta),
                run_workflow=adoption.rpc_name if lone else None,
                run_input_json=data if lone else None,
                run_wire_json=_LONE_TASK_WIRE if lone else None,
                routing_json=adoption.routing_json,
                chord_body=adoption.chord_body,
            )
        )

    def started(self, event: AttemptStarted, overdue: bool) -> None:
        adoption = event.adoption
        if adoption is not None and adopts(adoption, overdue):
            self.adopt(event, adoption)
        row = self.attempt(event.step_id, event.attempt)
        row.move("running", event.at)
        row.task_id = event.step_id
        # Two deliveries in one batch (a killed one's journal adopted with its redelivery's
        # events): the row says where and since when the later one ran, as SQL's guard does.
        first = row.running_at is None
        if first or event.at >= (row.running_at or 0.0) or not event.delivery:
            row.worker, row.pid = event.worker or row.worker, event.pid
        if first or (event.delivery and event.at > (row.running_at or 0.0)):
            row.running_at = event.at
        row.reason = row.reason or ("first" if event.attempt == 1 else "retry")
        if event.delivery and event.id not in row.delivery_ids:  # one event is one delivery
            row.delivery_ids.append(event.id)

    def dispatched(self, event: StepDispatched) -> None:
        row = self.attempt(event.step_id, event.attempt)
        row.move("scheduled", event.at)
        row.task_id = event.step_id

    def retried(self, event: AttemptRetried) -> None:
        self.ended(event.step_id, event.attempt, "failed", event.at, error_json=event.error_json)
        following = self.attempt(event.step_id, event.attempt + 1)
        # Strictly after the failure it follows, as a millisecond-precise reader sees it.
        next_at = event.at + _GAP
        following.move("scheduled", next_at)
        if following.scheduled_at is None:
            following.scheduled_at = next_at
        following.eta = event.eta if event.eta is not None else following.eta
        following.retries = event.retries if event.retries is not None else following.retries
        if event.retry_delay is not None:  # a delay of 0 is one too
            following.retry_delay = event.retry_delay
        following.task_id = event.step_id
        following.reason = following.reason or "retry"

    def ended(
        self,
        step_id: str,
        attempt: int | None,
        status: str,
        at: float,
        *,
        result_json: str | None = None,
        error_json: str | None = None,
    ) -> None:
        row = self.attempt(step_id, attempt)
        if row.move(status, at):
            row.ended_at = at
            row.result_json, row.error_json = result_json, error_json

    def succeeded(self, event: AttemptSucceeded) -> None:
        self.ended(
            event.step_id, event.attempt, "succeeded", event.at, result_json=event.result_json
        )
        kind = "replay" if event.orchestrated else "complete"
        self.outcome(event.step_id, event.run_id, kind, event.at)

    def failed(self, event: AttemptEnded) -> None:
        self.ended(
            event.step_id, event.attempt, event.status, event.at, error_json=event.error_json
        )
        if event.status == "failed":  # for good: Celery retries it no more
            self.attempt(event.step_id, event.attempt).gave_up = True
        kind: Any = "replay" if event.orchestrated else event.status
        self.outcome(
            event.step_id, event.run_id, kind, event.at, event.error_json, event.chord_bodies
        )

    def outcome(
        self,
        step_id: str,
        run_id: str | None,
        kind: Any,
        at: float,
        error: str | None = None,
        chord_bodies: tuple[str, ...] = (),
    ) -> None:
        self.batch.outcomes.append(
            RunOutcome(step_id, run_id, kind, moment(at), error, chord_bodies)
        )

    def finish(self) -> MirrorBatch:
        self.batch.transitions = [row.transition() for row in self._attempts.values() if row.seen]
        return self.batch


def plan(pending: Sequence[Pending]) -> MirrorBatch:
    """The store batch for these events, in journal order."""
    planner = _Planner()
    for item in pending:
        event = item.event
        if isinstance(event, StepPublished):
            planner.published(event, item.overdue)
        elif isinstance(event, AttemptStarted):
            planner.started(event, item.overdue)
        elif isinstance(event, StepDispatched):
            planner.dispatched(event)
        elif isinstance(event, AttemptRetried):
            planner.retried(event)
        elif isinstance(event, AttemptSucceeded):
            planner.succeeded(event)
        elif isinstance(event, AttemptEnded):
            planner.failed(event)
        elif isinstance(event, AttemptReplaced):
            planner.batch.handovers.append(
                Handover(event.step_id, event.attempt, event.replaced_by)
            )
        elif isinstance(event, ResultStored):
            planner.batch.results.append(
                ResultWrite(
                    task_id=event.step_id,
                    attempt=event.attempt,
                    status=event.state,
                    meta=base64.b64decode(event.meta_b64),
                    at=moment(event.at),
                    date_done=_maybe(event.date_done),
                )
            )
        elif isinstance(event, ChordApplied):
            planner.batch.chords.append(
                ChordWrite(
                    group_id=event.step_id,
                    parts=tuple(event.parts),
                    body=base64.b64decode(event.body_b64),
                    at=moment(event.at),
                )
            )
        elif isinstance(event, ChordExtended):
            planner.batch.chord_parts.append((event.step_id, event.part))
        elif isinstance(event, ChordSent):
            planner.batch.chords_sent.append((event.step_id, moment(event.at)))
        else:  # pragma: no cover - decode() makes only the kinds above
            raise TypeError(f"not a mirror event: {event!r}")
    return planner.finish()
