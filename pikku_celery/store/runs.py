"""Runs, their state, and reads of their steps and attempts."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from pikku_celery.errors import InvalidStatus, RunNotFound, StepNotFound, UnreadableValue
from pikku_celery.store import sql
from pikku_celery.store.common import (
    UNSET,
    ErrorLike,
    Unset,
    check_page,
    new_id,
    now,
    run_day,
    run_statuses,
)
from pikku_celery.store.connector import Connector
from pikku_celery.store.models import RUN_STATUSES, StepAttempt, StepState, WorkflowRun

__all__ = ["Runs"]


class Runs:
    """A run's own row (status, input, output, state) and the reads of its steps."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def create_run(
        self,
        workflow: str,
        input: Any,
        *,
        inline: bool = False,
        graph_hash: str | None = None,
        wire: Any = None,
        deterministic: bool = False,
        planned_steps: Any = None,
        run_id: str | None = None,
        status: str = "running",
        conn: sa.Connection | None = None,
    ) -> str:
        """Start recording a run; returns its id (a new UUID unless given)."""
        if not workflow:
            raise ValueError("A run needs a workflow name; pass workflow='checkout' or similar.")
        self._check_run_status(status)
        timestamp = now()
        row = {
            "workflow_run_id": run_id or new_id(),
            "workflow": workflow,
            "status": status,
            "input": self._db.json(input, "run input"),
            "state": "{}",
            "inline": inline,
            "graph_hash": graph_hash,
            "deterministic": deterministic,
            "planned_steps": None
            if planned_steps is None
            else self._db.json(planned_steps, "planned steps"),
            "wire": None if wire is None else self._db.json(wire, "wire"),
            "created_at": timestamp,
            "updated_at": timestamp,
            "run_day": run_day(timestamp),
        }
        with self._db.single(conn) as c:
            c.execute(sql.runs.insert_run, row)
        return str(row["workflow_run_id"])

    def get_run(self, run_id: str, *, conn: sa.Connection | None = None) -> WorkflowRun:
        with self._db.read(conn) as c:
            row = c.execute(sql.runs.get_run, {"run_id": run_id}).mappings().first()
        if row is None:
            raise RunNotFound(run_id)
        return WorkflowRun.from_row(row)

    def update_run_status(
        self,
        run_id: str,
        status: str,
        *,
        output: Any = UNSET,
        error: ErrorLike | Unset | None = UNSET,
        conn: sa.Connection | None = None,
    ) -> None:
        """Set the run's status; output and error are replaced (cleared when not given).

        An output of ``0``, ``""`` or ``False`` is stored as that value.
        """
        self._check_run_status(status)
        params = {
            "run_id": run_id,
            "status": status,
            "output": None if isinstance(output, Unset) else self._db.json(output, "run output"),
            "error": None
            if isinstance(error, Unset) or error is None
            else self._db.error_json(error),
            "now": now(),
        }
        with self._db.single(conn) as c:
            if c.execute(sql.runs.update_run_status, params).rowcount == 0:
                raise RunNotFound(run_id)

    def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: str | list[str] | tuple[str, ...] | None = None,
        limit: int = 50,
        offset: int = 0,
        conn: sa.Connection | None = None,
    ) -> list[WorkflowRun]:
        """Runs, newest first; page with ``limit`` and ``offset``."""
        check_page(limit, offset)
        statuses = run_statuses(status)
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if workflow is not None:
            params["workflow"] = workflow
        if statuses:
            params["statuses"] = statuses
        query = sql.runs.list_runs(workflow is not None, bool(statuses))
        with self._db.read(conn) as c:
            rows = c.execute(query, params).mappings().all()
        return [WorkflowRun.from_row(row) for row in rows]

    def delete_run(self, run_id: str, *, conn: sa.Connection | None = None) -> bool:
        """Delete a run with its steps and attempts; False when there was none."""
        with self._db.single(conn) as c:
            return bool(c.execute(sql.runs.delete_run, {"run_id": run_id}).rowcount)

    @staticmethod
    def _check_run_status(status: str) -> None:
        if status not in RUN_STATUSES:
            raise InvalidStatus("run", status, RUN_STATUSES)

    # --- run state ---------------------------------------------------------

    def update_run_state(
        self, run_id: str, key: str, value: Any, *, conn: sa.Connection | None = None
    ) -> None:
        """Set one key of the run's state, in one statement, without reading it first.

        The key is taken literally: dots, quotes and any unicode stay one key.
        """
        if not isinstance(key, str):
            raise TypeError(f"A state key must be a str, not {type(key).__name__}.")
        self._db.codec.check_key(key, "state key")
        params = {
            "run_id": run_id,
            "key": key,
            "value": self._db.json(value, f"value of state key {key[:60]!r}"),
            "now": now(),
        }
        with self._db.single(conn) as c:
            if c.execute(self._db.sql.update_run_state, params).rowcount == 0:
                raise RunNotFound(run_id)

    def get_run_state(self, run_id: str, *, conn: sa.Connection | None = None) -> dict[str, Any]:
        with self._db.read(conn) as c:
            row = c.execute(sql.runs.get_run_state, {"run_id": run_id}).first()
        if row is None:
            raise RunNotFound(run_id)
        state = {} if row[0] is None else row[0]
        if not isinstance(state, dict):
            # Another writer's value: a JSON string, say, where an object belongs.
            raise UnreadableValue("run state (a JSON object)", state, "a JSON object")
        return state

    def get_step_state(
        self, run_id: str, step_name: str, *, conn: sa.Connection | None = None
    ) -> StepState:
        """The step's row: one query, never the history table."""
        with self._db.read(conn) as c:
            row = (
                c.execute(sql.runs.get_step_state, {"run_id": run_id, "step_name": step_name})
                .mappings()
                .first()
            )
        if row is None:
            raise StepNotFound(run_id=run_id, step_name=step_name)
        return StepState.from_row(row)

    def list_step_states(
        self, run_id: str, *, conn: sa.Connection | None = None
    ) -> list[StepState]:
        """Every step of a run, in creation order, in one query ([] for an unknown run)."""
        with self._db.read(conn) as c:
            rows = c.execute(sql.runs.list_step_states, {"run_id": run_id}).mappings().all()
        return [StepState.from_row(row) for row in rows]

    def get_run_history(
        self, run_id: str, *, conn: sa.Connection | None = None
    ) -> list[StepAttempt]:
        """Every attempt of every step of the run: steps in creation order, attempts by number."""
        with self._db.read(conn) as c:
            rows = c.execute(sql.runs.run_history, {"run_id": run_id}).mappings().all()
        return [StepAttempt.from_row(row) for row in rows]
