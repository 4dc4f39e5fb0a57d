"""Runs, steps and attempts as JSON-ready dicts: the dashboard's ``/api/`` and the CLI's ``--json``.

Kept out of ``pikku_celery.dashboard`` so the command line can print the same
documents without the dashboard's extra dependencies.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pikku_celery.store import (
    CHILD_RPC_PREFIX,
    SLEEP_RPC,
    WAIT_RPC,
    RunEvent,
    StepAttempt,
    StepState,
    WorkflowRun,
    run_kind,
)

__all__ = [
    "RunParent",
    "StepWait",
    "attempt_json",
    "attempts_by_step",
    "event_json",
    "flower_task_url",
    "is_celery_task",
    "parent_json",
    "run_document",
    "run_json",
    "run_parent",
    "step_json",
    "step_wait",
    "steps_after",
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


def is_celery_task(step: StepState) -> bool:
    """Whether the step's attempts are Celery tasks of its own, which Flower knows by id.

    A durable sleep, a wait for an event and a child workflow are steps of the engine's:
    no task of theirs carries the id their attempts record.
    """
    rpc_name = step.rpc_name or ""
    return rpc_name not in (SLEEP_RPC, WAIT_RPC) and not rpc_name.startswith(CHILD_RPC_PREFIX)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _chord_header(body: StepState, steps: Sequence[StepState]) -> list[StepState] | None:
    """The header tasks of a chord whose body is ``body``, when the rows show them.

    Celery publishes a chord's body from its last header task to end, so the mirror
    records that one task as what the body follows. The body's first argument is the
    list of the header's results; the header is the group of steps that follow the same
    step as that task, all succeeded, whose results are that list.
    """
    args = body.data.get("args") if isinstance(body.data, Mapping) else None
    if not (isinstance(args, list) and args and isinstance(args[0], list) and len(args[0]) > 1):
        return None
    recorded = next(
        (s for s in steps if s.step_name == body.from_step_name and s.step_id != body.step_id),
        None,
    )
    if recorded is None:
        return None
    header = [
        s
        for s in steps
        if s.from_step_name == recorded.from_step_name
        and s.step_id != body.step_id
        and s.created_at <= body.created_at
    ]
    if len(header) != len(args[0]) or any(s.status != "succeeded" for s in header):
        return None
    # A group's results come in the order of its tasks; the rows' order is when each
    # step reached SQL, so the results are compared as a set with their repeats.
    if sorted(_canonical(s.result) for s in header) != sorted(map(_canonical, args[0])):
        return None
    return header


def _caught_failure(
    step: StepState, steps: Sequence[StepState], failed_at: Mapping[str, dt.datetime]
) -> StepState | None:
    """The step that failed for good before a durable workflow reached ``step``, if any.

    The engine records as a step's predecessor the last step whose ``ctx.do`` returned,
    so the step a workflow runs after catching ``StepFailed`` (a compensation) is
    recorded after the step before the one that failed. A workflow's code runs in order:
    a step first written after another that follows the same step had failed, comes
    after that one (the latest such, for a failure caught in a compensation's own).
    Steps of one ``ctx.do_all`` are written together, before any of them fails.
    """
    caught = [
        s
        for s in steps
        if s.step_id != step.step_id
        and s.from_step_name == step.from_step_name
        and s.created_at < step.created_at
        and s.step_id in failed_at
        and failed_at[s.step_id] <= step.created_at
    ]
    return max(caught, key=lambda s: s.created_at) if caught else None


def steps_after(
    run: WorkflowRun, steps: Sequence[StepState], history: Sequence[StepAttempt]
) -> dict[str, tuple[str, ...]]:
    """The steps each step comes after, by step id, names in the run's order.

    Mostly the one its row records (``from_step_name``); a chord's body comes after
    every task of its header, and a durable workflow's step after a failure it caught
    comes after the step that failed (see ``_chord_header`` and ``_caught_failure``).
    """
    workflow = run_kind(run.wire) == "workflow"
    failed_at: dict[str, dt.datetime] = {}
    for attempt in history:
        if attempt.status == "failed" and attempt.failed_at is not None:
            first = failed_at.get(attempt.step_id)
            failed_at[attempt.step_id] = min(first or attempt.failed_at, attempt.failed_at)
    after: dict[str, tuple[str, ...]] = {}
    for step in steps:
        if workflow:
            caught = _caught_failure(step, steps, failed_at)
            if caught is not None:
                after[step.step_id] = (caught.step_name,)
                continue
        elif step.from_step_name is not None:
            header = _chord_header(step, steps)
            if header is not None:
                after[step.step_id] = tuple(s.step_name for s in header)
                continue
        after[step.step_id] = () if step.from_step_name is None else (step.from_step_name,)
    return after


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
    step: StepState,
    attempts: Iterable[StepAttempt],
    flower_url: str | None,
    after: Sequence[str] | None = None,
    celery_state: str | None = None,
) -> dict[str, Any]:
    """A step with its attempts; ``after`` is what :func:`steps_after` says it follows
    (default: what its row records), and only Celery tasks get Flower links.
    ``celery_state``: its state in Celery's result backend when that is this store."""
    flower_url = flower_url if is_celery_task(step) else None
    return {
        "step_id": step.step_id,
        "step_name": step.step_name,
        "rpc_name": step.rpc_name,
        "status": step.status,
        "celery_state": celery_state,
        "data": step.data,
        "result": step.result,
        "error": None if step.error is None else dict(step.error),
        "current_attempt": step.attempt_count,
        "retries": step.retries,
        "retry_delay": step.retry_delay,
        "retry_delay_seconds": step.retry_delay_seconds,
        "from_step_name": step.from_step_name,
        "after": list(after if after is not None else filter(None, [step.from_step_name])),
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
    celery_states: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The run with each of its steps and each step's attempts, as ``/api/runs/{id}`` gives it.

    ``parent`` names the run and step that started a child run (None for any
    other), and ``events`` lists the events sent to the run, oldest first. Each step's
    ``after`` lists the steps it comes after (``from_step_name`` is its row's one), and its
    ``celery_state`` is what ``AsyncResult.state`` says (null without a stored result).
    """
    states = celery_states or {}
    by_step = attempts_by_step(history)
    step_names = {step.step_id: step.step_name for step in steps}
    after = steps_after(run, steps, history)
    return {
        "run": run_json(run),
        "parent": parent_json(run_parent(run)),
        "steps": [
            step_json(
                step,
                by_step.get(step.step_id, []),
                flower_url,
                after[step.step_id],
                states.get(step.step_id),
            )
            for step in steps
        ],
        "events": [event_json(event, step_names) for event in events],
    }
