"""Runs, steps and attempts as JSON-ready dicts: the dashboard's ``/api/`` and the CLI's ``--json``.

Kept out of ``pikku_celery.dashboard`` so the command line can print the same
documents without the dashboard's extra dependencies.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from pikku_celery.store import StepAttempt, StepState, WorkflowRun

__all__ = [
    "attempt_json",
    "attempts_by_step",
    "flower_task_url",
    "run_document",
    "run_json",
    "step_json",
]


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


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
    steps: Iterable[StepState],
    history: Sequence[StepAttempt],
    flower_url: str | None = None,
) -> dict[str, Any]:
    """The run with each of its steps and each step's attempts, as ``/api/runs/{id}`` gives it."""
    by_step = attempts_by_step(history)
    return {
        "run": run_json(run),
        "steps": [step_json(step, by_step.get(step.step_id, []), flower_url) for step in steps],
    }
