"""Writes that let concurrent workflow replays agree on who dispatches a step."""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

import sqlalchemy as sa

from pikku_celery.durations import format_duration
from pikku_celery.errors import InvalidStatus, StepNotFound
from pikku_celery.store import sql
from pikku_celery.store.attempts import Attempts
from pikku_celery.store.common import UNSET, ErrorLike, Unset, new_id, now
from pikku_celery.store.connector import Connector
from pikku_celery.store.models import RUN_STATUSES, StepState

__all__ = ["Claims"]

_CLAIM_STATUSES: Final = frozenset({"scheduled", "succeeded", "failed"})


class Claims:
    """Claims on steps: the one replay that creates a step dispatches it."""

    def __init__(self, db: Connector, attempts: Attempts) -> None:
        self._db = db
        self._attempts = attempts

    def claim_step(
        self,
        run_id: str,
        step_id: str,
        step_name: str,
        rpc_name: str | None,
        data: Any,
        *,
        status: str = "scheduled",
        from_step_name: str | None = None,
        retries: int | None = None,
        retry_delay: float | str | dt.timedelta | None = None,
        eta: dt.datetime | None = None,
        result: Any = None,
        error: ErrorLike | None = None,
        started_at: dt.datetime | None = None,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Create the step under exactly ``step_name`` with attempt 1, if nobody has.

        The unique (run, step name) pair is the claim: of two replays racing
        for one step, one gets True and dispatches it, the other gets False.
        An inline step is claimed already finished (``succeeded``/``failed``).
        """
        if status not in _CLAIM_STATUSES:
            raise InvalidStatus("claimed step", status, _CLAIM_STATUSES)
        timestamp = now()
        outcome: dict[str, Any] = {"result": None, "error": None}
        if status == "succeeded":
            outcome["result"] = self._db.json(result, f"result of step {step_name!r}")
        elif status == "failed":
            outcome["error"] = None if error is None else self._db.error_json(error)
        step, attempt = first_attempt_rows(
            step_id=step_id,
            run_id=run_id,
            step_name=step_name,
            rpc_name=rpc_name,
            data=self._db.json(data, f"input of step {step_name!r}"),
            status=status,
            retries=retries,
            retry_delay=retry_delay,
            from_step_name=from_step_name,
            timestamp=timestamp,
        )
        step.update(outcome)
        attempt.update(outcome, eta=eta, reason="first")
        if status == "scheduled":
            attempt["scheduled_at"] = timestamp
        else:
            attempt["running_at"] = started_at or timestamp
            attempt[sql.attempts.TIMESTAMP_COLUMN[status] or "failed_at"] = timestamp
            attempt["delivery_count"] = 1
        with self._db.write(conn) as c:
            # The run's rows carry its day: one read, by its key.
            step["run_day"] = attempt["run_day"] = c.execute(
                sql.runs.run_day_of, {"run_id": run_id}
            ).scalar()
            if c.execute(self._db.sql.claim_step, step).first() is None:
                return False
            c.execute(sql.attempts.insert_attempt, attempt)
        return True

    def take_pending_step(
        self,
        step_id: str,
        attempt: int,
        *,
        eta: dt.datetime | None = None,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Move a pending step (made so by resume or rerun) to scheduled; True for the winner."""
        params = {"step_id": step_id, "attempt_no": attempt, "now": now()}
        with self._db.write(conn) as c:
            if c.execute(sql.claims.take_pending, params).rowcount == 0:
                return False
            self._attempts.record_attempt(step_id, attempt, "scheduled", eta=eta, conn=c)
        return True

    def get_step(self, step_id: str, *, conn: sa.Connection | None = None) -> StepState:
        """A step by its id (for a Celery step, its task id): one query."""
        with self._db.read(conn) as c:
            row = c.execute(sql.claims.get_step, {"step_id": step_id}).mappings().first()
        if row is None:
            raise StepNotFound(step_id=step_id)
        return StepState.from_row(row)

    def move_run(
        self,
        run_id: str,
        status: str,
        *,
        from_statuses: tuple[str, ...],
        output: Any = UNSET,
        error: ErrorLike | None = None,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Set the run's status (and output, error) only if it is in one of ``from_statuses``."""
        for one in (status, *from_statuses):
            if one not in RUN_STATUSES:
                raise InvalidStatus("run", one, RUN_STATUSES)
        params = {
            "run_id": run_id,
            "new_status": status,
            "from_statuses": list(from_statuses),
            "output": None if isinstance(output, Unset) else self._db.json(output, "run output"),
            "error": None if error is None else self._db.error_json(error),
            "now": now(),
        }
        with self._db.single(conn) as c:
            return bool(c.execute(sql.claims.move_run, params).rowcount)


def first_attempt_rows(
    *,
    step_id: str,
    run_id: str,
    step_name: str,
    rpc_name: str | None,
    data: str,
    status: str,
    retries: int | None,
    retry_delay: float | str | dt.timedelta | None,
    from_step_name: str | None,
    timestamp: dt.datetime,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rows of a new step (``data`` already JSON) and of its attempt 1, before any
    status stamp."""
    step = {
        "workflow_step_id": step_id,
        "workflow_run_id": run_id,
        "step_name": step_name,
        "rpc_name": rpc_name,
        "data": data,
        "status": status,
        "retries": retries,
        "retry_delay": None if retry_delay is None else format_duration(retry_delay),
        "from_step_name": from_step_name,
        "current_attempt": 1,
        "created_at": timestamp,
        "updated_at": timestamp,
    }
    attempt = {
        "history_id": new_id(),
        "workflow_run_id": run_id,
        "workflow_step_id": step_id,
        "status": status,
        "attempt": 1,
        "created_at": timestamp,
    }
    return step, attempt
