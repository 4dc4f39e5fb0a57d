"""The records the store hands back: frozen dataclasses, never raw rows."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pikku_celery.durations import parse_duration
from pikku_celery.errors import InvalidDuration

__all__ = [
    "ATTEMPT_STATUSES",
    "CHILD_RPC_PREFIX",
    "LOST_ERROR_TYPE",
    "NEXT_ATTEMPT_GAP",
    "RUN_STATUSES",
    "SETTLED_RUN_STATUSES",
    "SLEEP_RPC",
    "STEP_STATUSES",
    "WAIT_RPC",
    "OpenAttempt",
    "RunEvent",
    "RunStatus",
    "StaleStep",
    "StepAttempt",
    "StepState",
    "StepStatus",
    "UnsentClaim",
    "WorkflowRun",
    "WorkflowVersion",
    "run_kind",
]

RunStatus = Literal["running", "suspended", "completed", "failed", "cancelled"]
StepStatus = Literal["pending", "scheduled", "running", "lost", "succeeded", "failed", "cancelled"]

# The task names recorded for the steps a workflow takes without a task of its own;
# the reaper leaves them alone (nothing of theirs is held by a worker).
SLEEP_RPC: Final = "pikku.sleep"
#: The error type the reaper writes on an attempt whose worker is gone.
LOST_ERROR_TYPE: Final = "pikku_celery.WorkerLost"
WAIT_RPC: Final = "pikku.wait"
CHILD_RPC_PREFIX: Final = "pikku.workflow:"

RUN_STATUSES: Final = frozenset({"running", "suspended", "completed", "failed", "cancelled"})
SETTLED_RUN_STATUSES: Final = frozenset({"completed", "failed", "cancelled"})
STEP_STATUSES: Final = frozenset(
    {"pending", "scheduled", "running", "lost", "succeeded", "failed", "cancelled"}
)
ATTEMPT_STATUSES: Final = STEP_STATUSES

#: How much later the next attempt of a step starts than the end of the one before it: a
#: millisecond, so readers that compare times at a millisecond's precision (Pikku's, as
#: JavaScript Dates) see it as strictly newer.
NEXT_ATTEMPT_GAP: Final = dt.timedelta(milliseconds=1)

# An attempt only moves forward through these ranks; an outcome is final.
# ``lost`` (set only by the reaper, from ``running``) ranks below ``running`` so
# that a redelivery of the same attempt, or its late outcome, still moves it on.
STATUS_RANK: Final[Mapping[str, int]] = {
    "pending": 0,
    "scheduled": 1,
    "lost": 2,
    "running": 3,
    "succeeded": 4,
    "failed": 4,
    "cancelled": 4,
}


def error_of(value: Any) -> Mapping[str, Any] | None:
    """An error column as a mapping. pikku-celery writes an object, and so does Pikku;
    another writer's string (or JSON text stored as a string) becomes the message,
    as it is, so every reader can show it."""
    if value is None or isinstance(value, Mapping):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return {"message": text}


def seconds_of(retry_delay: str | None) -> float | None:
    """A stored retry delay in seconds; None when there is none, or when another
    writer stored something that is not a duration (Pikku's ``'exponential'``)."""
    if retry_delay is None:
        return None
    try:
        return parse_duration(retry_delay).total_seconds()
    except InvalidDuration:
        return None


@dataclass(frozen=True, slots=True)
class WorkflowRun:
    """One execution of a workflow, a canvas or a lone task."""

    run_id: str
    workflow: str
    status: str
    input: Any
    output: Any
    error: Mapping[str, Any] | None
    #: A JSON object of run variables; another writer's value of another kind, as it is.
    state: Any
    inline: bool
    graph_hash: str | None
    deterministic: bool
    planned_steps: Any
    wire: Any
    created_at: dt.datetime
    updated_at: dt.datetime

    @property
    def kind(self) -> str:
        """``workflow``, ``canvas`` or ``task``: see :func:`run_kind`."""
        return run_kind(self.wire)

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> WorkflowRun:
        return cls(
            run_id=row["workflow_run_id"],
            workflow=row["workflow"],
            status=row["status"],
            input=row["input"],
            output=row["output"],
            error=error_of(row["error"]),
            state={} if row["state"] is None else row["state"],
            inline=bool(row["inline"]),
            graph_hash=row["graph_hash"],
            deterministic=bool(row["deterministic"]),
            planned_steps=row["planned_steps"],
            wire=row["wire"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class StepState:
    """A step as its row says now; ``attempt_count`` is the attempt it reflects."""

    step_id: str
    run_id: str
    step_name: str
    rpc_name: str | None
    data: Any
    status: str
    result: Any
    error: Mapping[str, Any] | None
    attempt_count: int
    retries: int | None
    retry_delay: str | None
    from_step_name: str | None
    child_run_id: str | None
    branch_taken: str | None
    created_at: dt.datetime
    updated_at: dt.datetime

    @property
    def retry_delay_seconds(self) -> float | None:
        """``retry_delay`` (``"5s"``, ``"200ms"``, or an older row's bare seconds) in seconds."""
        return seconds_of(self.retry_delay)

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> StepState:
        return cls(
            step_id=row["workflow_step_id"],
            run_id=row["workflow_run_id"],
            step_name=row["step_name"],
            rpc_name=row["rpc_name"],
            data=row["data"],
            status=row["status"],
            result=row["result"],
            error=error_of(row["error"]),
            # A row from an older writer has no attempt number: it is its first.
            attempt_count=row["current_attempt"] or 1,
            retries=row["retries"],
            retry_delay=row["retry_delay"],
            from_step_name=row["from_step_name"],
            child_run_id=row["child_run_id"],
            branch_taken=row["branch_taken"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class StepAttempt:
    """One attempt of one step, as ``get_run_history`` lists it."""

    history_id: str
    step_id: str
    step_name: str
    from_step_name: str | None
    attempt: int
    status: str
    result: Any
    error: Mapping[str, Any] | None
    retries: int | None
    retry_delay: str | None
    created_at: dt.datetime
    scheduled_at: dt.datetime | None
    running_at: dt.datetime | None
    succeeded_at: dt.datetime | None
    failed_at: dt.datetime | None
    task_id: str | None = None
    worker: str | None = None
    pid: int | None = None
    delivery_count: int = 0
    eta: dt.datetime | None = None
    reason: str | None = None
    #: The task that took over this attempt's task id (Celery's ``Task.replace``).
    replaced_by: str | None = None

    @property
    def retry_delay_seconds(self) -> float | None:
        """``retry_delay`` (``"5s"``, ``"200ms"``, or an older row's bare seconds) in seconds."""
        return seconds_of(self.retry_delay)

    @property
    def ended_at(self) -> dt.datetime | None:
        return self.succeeded_at or self.failed_at

    @property
    def duration(self) -> dt.timedelta | None:
        """How long the attempt ran, once it has ended."""
        if self.ended_at is None or self.running_at is None:
            return None
        return self.ended_at - self.running_at

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> StepAttempt:
        return cls(
            history_id=row["history_id"],
            step_id=row["workflow_step_id"],
            step_name=row["step_name"],
            from_step_name=row["from_step_name"],
            attempt=row["attempt"] or 1,
            status=row["status"],
            result=row["result"],
            error=error_of(row["error"]),
            retries=row["retries"],
            retry_delay=row["retry_delay"],
            created_at=row["created_at"],
            scheduled_at=row["scheduled_at"],
            running_at=row["running_at"],
            succeeded_at=row["succeeded_at"],
            failed_at=row["failed_at"],
            task_id=row["task_id"],
            worker=row["worker"],
            pid=row["pid"],
            delivery_count=row["delivery_count"],
            eta=row["eta"],
            reason=row["reason"],
            replaced_by=row.get("replaced_by"),
        )


@dataclass(frozen=True, slots=True)
class WorkflowVersion:
    """The definition of one version of a workflow."""

    workflow_name: str
    graph_hash: str
    graph: Any
    source: str
    status: str
    created_at: dt.datetime

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> WorkflowVersion:
        return cls(
            workflow_name=row["workflow_name"],
            graph_hash=row["graph_hash"],
            graph=row["graph"],
            source=row["source"],
            status=row["status"],
            created_at=row["created_at"],
        )


def run_kind(wire: Any) -> str:
    """What made a run, from its ``wire``: ``workflow``, ``canvas`` or ``task`` (a lone
    task's own run, and anything this version does not know). The one place that decides."""
    kind = wire.get("type") if isinstance(wire, dict) else None
    return kind if kind in ("workflow", "canvas") else "task"


def _step_to_send(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The fields of a step the reaper may send again (``sql.reap``)."""
    return {
        "run_id": row["workflow_run_id"],
        "run_kind": run_kind(row["wire"]),
        "step_id": row["workflow_step_id"],
        "step_name": row["step_name"],
        "rpc_name": row["rpc_name"],
        "data": row["data"],
        "attempt": row["attempt"],
        "routing": row["routing"] if isinstance(row["routing"], dict) else None,
    }


@dataclass(frozen=True, slots=True)
class OpenAttempt:
    """A step's current attempt that is ``running`` or ``lost``: what the reaper looks at."""

    run_id: str
    run_kind: str
    step_id: str
    step_name: str
    rpc_name: str | None
    data: Any
    retries: int | None
    attempt: int
    status: str
    task_id: str | None
    worker: str | None
    pid: int | None
    delivery_count: int
    running_at: dt.datetime | None
    error: Mapping[str, Any] | None
    updated_at: dt.datetime | None = None
    #: Where the step's first message went: ``exchange`` and ``routing_key``.
    routing: Mapping[str, Any] | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> OpenAttempt:
        return cls(
            **_step_to_send(row),
            retries=row["retries"],
            status=row["status"],
            task_id=row["task_id"],
            worker=row["worker"],
            pid=row["pid"],
            delivery_count=row["delivery_count"],
            running_at=row["running_at"],
            error=error_of(row["error"]),
            updated_at=row.get("updated_at"),
        )


@dataclass(frozen=True, slots=True)
class UnsentClaim:
    """A step a durable workflow's replay claimed whose message never went out."""

    run_id: str
    run_kind: str
    step_id: str
    step_name: str
    rpc_name: str
    data: Any
    attempt: int
    scheduled_at: dt.datetime | None
    routing: Mapping[str, Any] | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> UnsentClaim:
        return cls(**_step_to_send(row), scheduled_at=row["scheduled_at"])


@dataclass(frozen=True, slots=True)
class StaleStep:
    """A scheduled step whose message nobody has consumed for too long."""

    run_id: str
    step_id: str
    step_name: str
    rpc_name: str | None
    attempt: int
    scheduled_at: dt.datetime | None
    eta: dt.datetime | None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> StaleStep:
        return cls(
            run_id=row["workflow_run_id"],
            step_id=row["workflow_step_id"],
            step_name=row["step_name"],
            rpc_name=row["rpc_name"],
            attempt=row["attempt"],
            scheduled_at=row["scheduled_at"],
            eta=row["eta"],
        )


@dataclass(frozen=True, slots=True)
class RunEvent:
    """An event sent to a run; ``taken_by_step_id`` is the wait that took it, if one has."""

    event_id: str
    run_id: str
    name: str
    data: Any
    sent_at: dt.datetime
    taken_by_step_id: str | None
    taken_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> RunEvent:
        return cls(
            event_id=row["event_id"],
            run_id=row["workflow_run_id"],
            name=row["name"],
            data=row["data"],
            sent_at=row["sent_at"],
            taken_by_step_id=row["taken_by_step_id"],
            taken_at=row["taken_at"],
        )
