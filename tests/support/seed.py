"""Runs to prune: many old ones written straight into the tables, fast on both databases."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.schema import workflow_runs, workflow_step, workflow_step_history


def add_runs(
    store: WorkflowStore,
    count: int,
    *,
    age: dt.timedelta,
    statuses: Iterable[str] = ("completed", "failed", "cancelled"),
    workflow: str = "old",
) -> list[str]:
    """``count`` runs created ``age`` ago (a second apart), cycling through ``statuses``;
    each has one step with two attempts (a retry, then the outcome)."""
    cycle = list(statuses)
    start = dt.datetime.now(dt.timezone.utc) - age
    runs: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    attempts: list[dict[str, Any]] = []
    for n in range(count):
        created = start - dt.timedelta(seconds=n)
        # Every row of a run carries its run's day (revision 0016), as the store writes it:
        # the partitioned layout keeps a row only with it.
        day = created.astimezone(dt.timezone.utc).date()
        run_id, step_id = str(uuid.uuid4()), str(uuid.uuid4())
        status = cycle[n % len(cycle)]
        runs.append(
            {
                "workflow_run_id": run_id,
                "workflow": workflow,
                "status": status,
                "input": "{}",
                "state": "{}",
                "created_at": created,
                "updated_at": created,
                "run_day": day,
            }
        )
        steps.append(
            {
                "workflow_step_id": step_id,
                "workflow_run_id": run_id,
                "step_name": "work",
                "status": "succeeded",
                "current_attempt": 2,
                "created_at": created,
                "updated_at": created,
                "run_day": day,
            }
        )
        for attempt, outcome in ((1, "failed"), (2, "succeeded")):
            attempts.append(
                {
                    "history_id": str(uuid.uuid4()),
                    "workflow_run_id": run_id,
                    "workflow_step_id": step_id,
                    "status": outcome,
                    "attempt": attempt,
                    "created_at": created,
                    "run_day": day,
                }
            )
    with store.engine.begin() as conn:
        conn.execute(sa.insert(workflow_runs), runs)
        conn.execute(sa.insert(workflow_step), steps)
        conn.execute(sa.insert(workflow_step_history), attempts)
    return [row["workflow_run_id"] for row in runs]
