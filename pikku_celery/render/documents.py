"""Runs, steps and attempts as JSON-ready dicts: the dashboard's ``/api/`` and the CLI's ``--json``.

Kept out of ``pikku_celery.dashboard`` so the command line can print the same
documents without the dashboard's extra dependencies.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pikku_celery.store import WAIT_RPC, RunEvent, StepAttempt, StepState, WorkflowRun

__all__ = [
    "RunParent",
    "StepWait",
    "attempt_json",
    "attempts_by_step",
    "event_json",
    "flower_task_url",
    "parent_json",
    "run_document",
    "run_json",
    "run_parent",
    "step_json",
    "step_wait",
    "wait_json",
]


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@dataclass(frozen=True, slots=True)
class RunParent:
    """The run and step that started a child run (``ctx.do(name, child_workflow)``)."""

    run_id: str
    step_id: str
    step_name: str | None


def run_parent(run: WorkflowRun) -> RunParent | None:
    """The parent of a child run, from its ``wire``; None for any other run."""
    wire = run.wire if isinstance(run.wire, Mapping) else {}
    run_id, step_id, step_name = (
        wire.get("parent_run_id"),
        wire.get("parent_step_id"),
        wire.get("parent_step_name"),
    )
    if not (isinstance(run_id, str) and isinstance(step_id, str)):
        return None
    return RunParent(run_id, step_id, step_name if isinstance(step_name, str) else None)


def parent_json(parent: RunParent | None) -> dict[str, Any] | None:
    if parent is None:
        return None
    return {"run_id": parent.run_id, "step_id": parent.step_id, "step_name": parent.step_name}


@dataclass(frozen=True, slots=True)
class StepWait:
    """What a ``ctx.wait_for`` step waits for; ``waiting`` while no event has ended it."""

    event: str
    deadline: dt.datetime | None
    waiting: bool


def step_wait(step: StepState) -> StepWait | None:
    """The wait of a ``pikku.wait`` step, from its ``data``; None for any other step."""
    data = step.data
    if step.rpc_name != WAIT_RPC or not isinstance(data, Mapping):
        return None
    event = data.get("event")
    if not isinstance(event, str):
        return None
    deadline: dt.datetime | None = None
    text = data.get("deadline")
    if isinstance(text, str):
        try:
            deadline = dt.datetime.fromisoformat(text)
        except ValueError:  # another writer's text: the wait is still worth showing
            deadline = None
    return StepWait(event, deadline, step.status in ("pending", "scheduled"))


def wait_json(wait: StepWait | None) -> dict[str, Any] | None:
    if wait is None:
        return None
    return {"event": wait.event, "deadline": _iso(wait.deadline), "waiting": wait.waiting}


def event_json(event: RunEvent, step_names: Mapping[str, str]) -> dict[str, Any]:
    """An event sent to the run; ``taken_by_step_name`` names the wait that took it."""
    taken_by = event.taken_by_step_id
    return {
        "event_id": event.event_id,
        "name": event.name,
        "data": event.data,
        "sent_at": _iso(event.sent_at),
        "taken_by_step_id": taken_by,
        "taken_by_step_name": None if taken_by is None else step_names.get(taken_by),
        "taken_at": _iso(event.taken_at),
    }


def flower_task_url(flower_url: str | None, task_id: str | None) -> str | None:
    """Flower's page of one Celery task, when Flower's address is configured."""
    if not flower_url or not task_id:
        return None
    return f"{flower_url}/task/{quote(task_id, safe='')}"


def run_json(run: WorkflowRun) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "workflow": run.workflow,
        "status": run.status,
        "input": run.input,
        "output": run.output,
        "error": None if run.error is None else dict(run.error),
        "state": dict(run.state) if isinstance(run.state, Mapping) else run.state,
        "inline": run.inline,
        "graph_hash": run.graph_hash,
        "deterministic": run.deterministic,
        "planned_steps": run.planned_steps,
        "wire": run.wire,
        "created_at": _iso(run.created_at),
        "updated_at": _iso(run.updated_at),
    }


def attempt_json(attempt: StepAttempt, flower_url: str | None) -> dict[str, Any]:
    duration = attempt.duration
    return {
        "history_id": attempt.history_id,
        "attempt": attempt.attempt,
        "status": attempt.status,
        "reason": attempt.reason,
        "result": attempt.result,
        "error": None if attempt.error is None else dict(attempt.error),
        "task_id": attempt.task_id,
        "worker": attempt.worker,
        "pid": attempt.pid,
        "delivery_count": attempt.delivery_count,
        "created_at": _iso(attempt.created_at),
        "scheduled_at": _iso(attempt.scheduled_at),
        "eta": _iso(attempt.eta),
        "running_at": _iso(attempt.running_at),
        "succeeded_at": _iso(attempt.succeeded_at),
        "failed_at": _iso(attempt.failed_at),
        "duration_seconds": None if duration is None else duration.total_seconds(),
        "flower_url": flower_task_url(flower_url, attempt.task_id),
    }


def step_json(
    step: StepState, attempts: Iterable[StepAttempt], flower_url: str | None
) -> dict[str, Any]:
    return {
        "step_id": step.step_id,
        "step_name": step.step_name,
        "rpc_name": step.rpc_name,
        "status": step.status,
        "data": step.data,
        "result": step.result,
        "error": None if step.error is None else dict(step.error),
        "current_attempt": step.attempt_count,
        "retries": step.retries,
        "retry_delay": step.retry_delay,
        "retry_delay_seconds": step.retry_delay_seconds,
        "from_step_name": step.from_step_name,
        "child_run_id": step.child_run_id,
        "branch_taken": step.branch_taken,
        "wait": wait_json(step_wait(step)),
        "created_at": _iso(step.created_at),
        "updated_at": _iso(step.updated_at),
        "attempts": [attempt_json(a, flower_url) for a in attempts],
    }


def attempts_by_step(attempts: Sequence[StepAttempt]) -> dict[str, list[StepAttempt]]:
    grouped: dict[str, list[StepAttempt]] = {}
    for attempt in attempts:
        grouped.setdefault(attempt.step_id, []).append(attempt)
    return grouped


def run_document(
    run: WorkflowRun,
    steps: Sequence[StepState],
    history: Sequence[StepAttempt],
    flower_url: str | None = None,
    events: Sequence[RunEvent] = (),
) -> dict[str, Any]:
    """The run with each of its steps and each step's attempts, as ``/api/runs/{id}`` gives it.

    ``parent`` names the run and step that started a child run (None for any
    other), and ``events`` lists the events sent to the run, oldest first.
    """
    by_step = attempts_by_step(history)
    step_names = {step.step_id: step.step_name for step in steps}
    return {
        "run": run_json(run),
        "parent": parent_json(run_parent(run)),
        "steps": [step_json(step, by_step.get(step.step_id, []), flower_url) for step in steps],
        "events": [event_json(event, step_names) for event in events],
    }
