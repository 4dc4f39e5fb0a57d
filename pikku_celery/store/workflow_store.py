"""``WorkflowStore``: the transactional SQL mirror of runs, steps and attempts.

Its runs, steps and versions; the other operations are its mixins, each beside
its statements in ``store/sql/`` (``attempts`` / ``sql.attempts``, ...). Knows nothing
of Celery. Every write takes an optional connection: given one, it runs there
and leaves committing to the caller; otherwise it commits its own transaction.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final, Literal

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from pikku_celery.errors import (
    InvalidStatus,
    RunNotFound,
    StepAlreadyExists,
    StepNotFound,
    StoreError,
    UnreadableValue,
    VersionNotFound,
)
from pikku_celery.store.base import UNSET, ErrorLike, StoreBase, _Unset, check_page, run_statuses
from pikku_celery.store.base import new_id as _new_id
from pikku_celery.store.base import now as _now
from pikku_celery.store.batches import BatchWrites
from pikku_celery.store.leases import LeaseWrites
from pikku_celery.store.models import (
    RUN_STATUSES,
    StepAttempt,
    StepState,
    WorkflowRun,
    WorkflowVersion,
)
from pikku_celery.store.prune import StorePrune
from pikku_celery.store.reap import StoreReap
from pikku_celery.store.sql import workflow_store as q
from pikku_celery.store.stats import StoreStats
from pikku_celery.store.workflows import WorkflowWrites

__all__ = ["UNSET", "WorkflowStore"]

NewAttemptStatus = Literal["pending", "scheduled", "running"]
_NEW_ATTEMPT_STATUSES: Final = frozenset({"pending", "scheduled", "running"})
_VERSION_STATUSES: Final = frozenset({"draft", "active", "declined"})


class WorkflowStore(
    WorkflowWrites, BatchWrites, LeaseWrites, StoreReap, StoreStats, StorePrune, StoreBase
):
    """Reads and writes workflow runs, steps and attempts in one SQL database.

    ``WorkflowStore("postgresql://...")``, ``WorkflowStore("sqlite:///pikku.db")``
    or ``WorkflowStore(engine)``. Call :meth:`init` (or ``pikku-celery db
    upgrade``) once to bring the schema up to date.
    """

    # --- runs --------------------------------------------------------------

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
        now = _now()
        row = {
            "workflow_run_id": run_id or _new_id(),
            "workflow": workflow,
            "status": status,
            "input": self._json(input, "run input"),
            "state": "{}",
            "inline": inline,
            "graph_hash": graph_hash,
            "deterministic": deterministic,
            "planned_steps": None
            if planned_steps is None
            else self._json(planned_steps, "planned steps"),
            "wire": None if wire is None else self._json(wire, "wire"),
            "created_at": now,
            "updated_at": now,
        }
        with self._single(conn) as c:
            c.execute(q.insert_run, row)
        return str(row["workflow_run_id"])

    def get_run(self, run_id: str, *, conn: sa.Connection | None = None) -> WorkflowRun:
        with self._read(conn) as c:
            row = c.execute(q.get_run, {"run_id": run_id}).mappings().first()
        if row is None:
            raise RunNotFound(run_id)
        return WorkflowRun.from_row(row)

    def update_run_status(
        self,
        run_id: str,
        status: str,
        *,
        output: Any = UNSET,
        error: ErrorLike | _Unset | None = UNSET,
        conn: sa.Connection | None = None,
    ) -> None:
        """Set the run's status; output and error are replaced (cleared when not given).

        An output of ``0``, ``""`` or ``False`` is stored as that value.
        """
        self._check_run_status(status)
        params = {
            "run_id": run_id,
            "status": status,
            "output": None if isinstance(output, _Unset) else self._json(output, "run output"),
            "error": None
            if isinstance(error, _Unset) or error is None
            else self._error_json(error),
            "now": _now(),
        }
        with self._single(conn) as c:
            if c.execute(q.update_run_status, params).rowcount == 0:
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
        query = q.list_runs(workflow is not None, bool(statuses))
        with self._read(conn) as c:
            rows = c.execute(query, params).mappings().all()
        return [WorkflowRun.from_row(row) for row in rows]

    def delete_run(self, run_id: str, *, conn: sa.Connection | None = None) -> bool:
        """Delete a run with its steps and attempts; False when there was none."""
        with self._single(conn) as c:
            return bool(c.execute(q.delete_run, {"run_id": run_id}).rowcount)

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
        self.codec.check_key(key, "state key")
        params = {
            "run_id": run_id,
            "key": key,
            "value": self._json(value, f"value of state key {key[:60]!r}"),
            "now": _now(),
        }
        statement = q.update_run_state_pg if self._pg else q.update_run_state_sqlite
        with self._single(conn) as c:
            if c.execute(statement, params).rowcount == 0:
                raise RunNotFound(run_id)

    def get_run_state(self, run_id: str, *, conn: sa.Connection | None = None) -> dict[str, Any]:
        with self._read(conn) as c:
            row = c.execute(q.get_run_state, {"run_id": run_id}).first()
        if row is None:
            raise RunNotFound(run_id)
        state = {} if row[0] is None else row[0]
        if not isinstance(state, dict):
            # Another writer's value: a JSON string, say, where an object belongs.
            raise UnreadableValue("run state (a JSON object)", state, "a JSON object")
        return state

    # --- steps -------------------------------------------------------------

    def insert_step_state(
        self,
        run_id: str,
        step_name: str,
        rpc_name: str | None,
        data: Any,
        *,
        retries: int | None = None,
        retry_delay: float | str | dt.timedelta | None = None,
        from_step_name: str | None = None,
        status: NewAttemptStatus = "pending",
        step_id: str | None = None,
        conn: sa.Connection | None = None,
    ) -> StepState:
        """Create a step and its first attempt, both in one transaction."""
        if not step_name:
            raise ValueError("A step needs a name.")
        if status not in _NEW_ATTEMPT_STATUSES:
            raise InvalidStatus("new step", status, _NEW_ATTEMPT_STATUSES)
        now = _now()
        step, attempt = self._first_attempt_rows(
            step_id=step_id or _new_id(),
            run_id=run_id,
            step_name=step_name,
            rpc_name=rpc_name,
            data=data,
            status=status,
            retries=retries,
            retry_delay=retry_delay,
            from_step_name=from_step_name,
            timestamp=now,
        )
        stamp = q.TIMESTAMP_COLUMN[status]
        if stamp is not None:
            attempt[stamp] = now
        try:
            with self._tx(conn) as c:
                c.execute(q.insert_step, step)
                c.execute(q.insert_attempt, attempt)
        except StoreError as exc:
            raise self._classify_integrity(exc, run_id, step_name) from exc.__cause__
        return StepState(
            step_id=step["workflow_step_id"],
            run_id=run_id,
            step_name=step_name,
            rpc_name=rpc_name,
            data=data,
            status=status,
            result=None,
            error=None,
            attempt_count=1,
            retries=retries,
            retry_delay=step["retry_delay"],
            from_step_name=from_step_name,
            child_run_id=None,
            branch_taken=None,
            created_at=now,
            updated_at=now,
        )

    @staticmethod
    def _classify_integrity(exc: StoreError, run_id: str, step_name: str) -> StoreError:
        cause = exc.__cause__
        if not isinstance(cause, sa_exc.IntegrityError):
            return exc
        text = str(cause.orig).lower()
        if "foreign key" in text:
            return RunNotFound(run_id)
        if "unique" in text or "duplicate" in text:
            return StepAlreadyExists(run_id, step_name)
        return exc

    def get_step_state(
        self, run_id: str, step_name: str, *, conn: sa.Connection | None = None
    ) -> StepState:
        """The step's row: one query, never the history table."""
        with self._read(conn) as c:
            row = (
                c.execute(q.get_step_state, {"run_id": run_id, "step_name": step_name})
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
        with self._read(conn) as c:
            rows = c.execute(q.list_step_states, {"run_id": run_id}).mappings().all()
        return [StepState.from_row(row) for row in rows]

    # --- transitions -------------------------------------------------------

    def set_step_scheduled(self, step_id: str, *, conn: sa.Connection | None = None) -> bool:
        return self._transition(step_id, "scheduled", {}, conn)

    def set_step_running(self, step_id: str, *, conn: sa.Connection | None = None) -> bool:
        return self._transition(step_id, "running", {}, conn)

    def set_step_result(
        self, step_id: str, result: Any, *, conn: sa.Connection | None = None
    ) -> bool:
        return self._transition(
            step_id, "succeeded", {"result": self._json(result, "step result")}, conn
        )

    def set_step_error(
        self, step_id: str, error: ErrorLike, *, conn: sa.Connection | None = None
    ) -> bool:
        return self._transition(step_id, "failed", {"error": self._error_json(error)}, conn)

    def _transition(
        self, step_id: str, status: str, outcome: dict[str, str], conn: sa.Connection | None
    ) -> bool:
        """Move the step and its current attempt to ``status``, both or neither.

        Returns False when the event changed nothing because the attempt is
        already there or further on (a duplicate or a late event).
        """
        params: dict[str, Any] = {
            "step_id": step_id,
            "now": _now(),
            "history_id": _new_id(),
            **outcome,
        }
        with self._single(conn) as c:
            if self._pg:
                applied = self._run_compiled(c, q.transition_pg(status), params).first() is not None
            else:
                step = self._run_compiled(c, q.transition_sqlite_step(status), params)
                attempt = step.scalar()
                applied = attempt is not None
                if applied:
                    params["attempt_no"] = attempt
                    row = self._run_compiled(c, q.transition_sqlite_attempt(status), params)
                    if row.rowcount == 0:
                        c.execute(q.transition_sqlite_repair(status), params)
            # Cold path only: nothing changed, so tell a no-op from a missing step.
            if not applied and c.execute(q.step_exists, {"step_id": step_id}).first() is None:
                raise StepNotFound(step_id=step_id)
        return applied

    def create_retry_attempt(
        self,
        step_id: str,
        status: NewAttemptStatus = "pending",
        *,
        reason: str = "retry",
        conn: sa.Connection | None = None,
    ) -> StepState:
        """Move the step to attempt n+1 and add that attempt's row, atomically.

        ``reason`` is recorded on the attempt: ``retry``, ``resume``, ``rerun``...
        """
        if status not in _NEW_ATTEMPT_STATUSES:
            raise InvalidStatus("new attempt", status, _NEW_ATTEMPT_STATUSES)
        now = _now()
        params = {"step_id": step_id, "now": now, "history_id": _new_id(), "reason": reason}
        with self._single(conn) as c:
            if self._pg:
                row = c.execute(q.retry_attempt_pg(status), params).mappings().first()
            else:
                row = c.execute(q.retry_attempt_sqlite(status), params).mappings().first()
                if row is not None:
                    attempt: dict[str, Any] = {
                        "history_id": params["history_id"],
                        "workflow_step_id": step_id,
                        "status": status,
                        "attempt": row["current_attempt"],
                        "created_at": now,
                        "reason": reason,
                    }
                    stamp = q.TIMESTAMP_COLUMN[status]
                    if stamp is not None:
                        attempt[stamp] = now
                    c.execute(q.insert_attempt, attempt)
            if row is None:
                raise StepNotFound(step_id=step_id)
        return StepState.from_row(row)

    # --- history -----------------------------------------------------------

    def get_run_history(
        self, run_id: str, *, conn: sa.Connection | None = None
    ) -> list[StepAttempt]:
        """Every attempt of every step of the run: steps in creation order, attempts by number."""
        with self._read(conn) as c:
            rows = c.execute(q.run_history, {"run_id": run_id}).mappings().all()
        return [StepAttempt.from_row(row) for row in rows]

    # --- versions ----------------------------------------------------------

    def upsert_workflow_version(
        self,
        workflow_name: str,
        graph_hash: str,
        graph: Any,
        source: str,
        status: str = "active",
        *,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Record a workflow version; the first writer wins. True when this call wrote it."""
        if status not in _VERSION_STATUSES:
            raise InvalidStatus("workflow version", status, _VERSION_STATUSES)
        row = {
            "workflow_name": workflow_name,
            "graph_hash": graph_hash,
            "graph": self._json(graph, "workflow graph"),
            "source": source,
            "status": status,
            "created_at": _now(),
        }
        with self._single(conn) as c:
            return c.execute(q.upsert_workflow_version(self.dialect), row).first() is not None

    def get_workflow_version(
        self, workflow_name: str, graph_hash: str, *, conn: sa.Connection | None = None
    ) -> WorkflowVersion | None:
        with self._read(conn) as c:
            row = (
                c.execute(
                    q.get_workflow_version,
                    {"workflow_name": workflow_name, "graph_hash": graph_hash},
                )
                .mappings()
                .first()
            )
        return None if row is None else WorkflowVersion.from_row(row)

    def update_workflow_version_status(
        self,
        workflow_name: str,
        graph_hash: str,
        status: str,
        *,
        conn: sa.Connection | None = None,
    ) -> None:
        if status not in _VERSION_STATUSES:
            raise InvalidStatus("workflow version", status, _VERSION_STATUSES)
        params = {"name": workflow_name, "hash": graph_hash, "new_status": status}
        with self._single(conn) as c:
            if c.execute(q.update_workflow_version_status, params).rowcount == 0:
                raise VersionNotFound(workflow_name, graph_hash)
