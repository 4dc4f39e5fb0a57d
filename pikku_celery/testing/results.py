"""``RunResult``: a run as the store holds it once the inline runner is idle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pikku_celery.store import StepAttempt, WorkflowRun, WorkflowStore

__all__ = ["RunResult", "StepResult", "read_result"]


@dataclass(frozen=True)
class StepResult:
    """One step of a run, with every attempt it had (attempt 1 first)."""

    name: str
    status: str
    result: Any
    error: Mapping[str, Any] | None
    attempts: tuple[StepAttempt, ...]
    #: The run a child workflow's step started, and the branch taken after the step.
    child_run_id: str | None = None
    branch_taken: str | None = None

    @property
    def attempt_statuses(self) -> list[str]:
        """Each attempt's status in order, e.g. ``["failed", "failed", "succeeded"]``."""
        return [attempt.status for attempt in self.attempts]


@dataclass(frozen=True)
class RunResult:
    """A run and its steps, read from the store in one go; ``steps`` by step name."""

    run_id: str
    workflow: str
    status: str
    output: Any
    error: Mapping[str, Any] | None
    steps: dict[str, StepResult]
    run: WorkflowRun


def read_result(store: WorkflowStore, run_id: str) -> RunResult:
    """The run ``run_id`` now: its row, its steps and each step's attempts."""
    run = store.get_run(run_id)
    attempts: dict[str, list[StepAttempt]] = {}
    for attempt in store.get_run_history(run_id):
        attempts.setdefault(attempt.step_id, []).append(attempt)
    steps = {
        step.step_name: StepResult(
            name=step.step_name,
            status=step.status,
            result=step.result,
            error=step.error,
            attempts=tuple(sorted(attempts.get(step.step_id, []), key=lambda a: a.attempt)),
            child_run_id=step.child_run_id,
            branch_taken=step.branch_taken,
        )
        for step in store.list_step_states(run_id)
    }
    return RunResult(
        run_id=run.run_id,
        workflow=run.workflow,
        status=run.status,
        output=run.output,
        error=run.error,
        steps=steps,
        run=run,
    )
