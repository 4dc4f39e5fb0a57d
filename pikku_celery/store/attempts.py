"""Writes addressed to attempt K of a step: what an event from a worker carries.

Each method is safe to call late, twice, or before the event that should have
come first; see ``sql.attempts`` for the rules that make that so.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final, Literal

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from pikku_celery.errors import InvalidStatus, StepNotFound, StoreError
from pikku_celery.store import sql
from pikku_celery.store.common import UNSET, ErrorLike, Unset, new_id, now
from pikku_celery.store.connector import Connector
from pikku_celery.store.models import StepState

__all__ = ["Attempts", "NewAttemptStatus", "NewRun"]

NewAttemptStatus = Literal["pending", "scheduled", "running"]
_NEW_ATTEMPT_STATUSES: Final = frozenset({"pending", "scheduled", "running"})

_ATTEMPT_EVENTS: Final = frozenset({"scheduled", "running", "succeeded", "failed", "cancelled"})
_ENDED: Final = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to create with a step, when the step is not part of one yet."""

    workflow: str
    input: Any
    wire: Any = None


class Attempts:
    """Writes addressed to attempt K of a step, and the run outcomes they lead to."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def run_of(self, c: sa.Connection, step_id: str, run_id: str | None) -> str | None:
        """The step's run: ``run_id`` when the caller names it, else looked up by the step's
        id (None: no such step, and the statements that follow change nothing)."""
        if run_id is not None:
            return run_id
        found = c.execute(sql.attempts.step_run, {"step_id": step_id}).scalar()
        return None if found is None else str(found)

    def record_attempt(
        self,
        step_id: str,
        attempt: int,
        status: str,
        *,
        result: Any = UNSET,
        error: ErrorLike | None = None,
        task_id: str | None = None,
        worker: str | None = None,
        pid: int | None = None,
        eta: dt.datetime | None = None,
        reason: str | None = None,
        at: dt.datetime | None = None,
        run_id: str | None = None,
        conn: sa.Connection | None = None,
    ) -> None:
        """Attempt ``attempt`` of the step moved to ``status``: both rows, no read first.

        ``at``: when it happened (default now). ``run_id``: the step's run, if the caller
        knows it (the statements then name it; else they look it up by the step's id).

        The attempt row is created if it does not exist yet. A ``running``
        event for an attempt that already ran is a redelivery: it adds to the
        attempt's ``delivery_count`` and never makes a new attempt.
        """
        if status not in _ATTEMPT_EVENTS:
            raise InvalidStatus("attempt", status, _ATTEMPT_EVENTS)
        if attempt < 1:
            raise ValueError(f"Attempts are numbered from 1, not {attempt}.")
        timestamp = at or now()
        params: dict[str, Any] = {
            "run_id": run_id,
            "step_id": step_id,
            "attempt_no": attempt,
            "history_id": new_id(),
            "now": timestamp,
            "task_id": task_id,
            "worker": worker,
            "pid": pid,
            "eta": eta,
            "reason": reason,
            "deliveries": 1 if status == "running" else 0,
            "scheduled_at": timestamp if status == "scheduled" else None,
            "running_at": timestamp if status == "running" else None,
            "ended_at": timestamp if status in _ENDED else None,
            "retries": None,
            "retry_delay": None,
        }
        if status == "succeeded":
            params["result"] = self._db.json(
                None if isinstance(result, Unset) else result, "step result"
            )
        elif status in ("failed", "cancelled"):
            params["error"] = None if error is None else self._db.error_json(error)
        try:
            with self._db.single(conn) as c:
                params["run_id"] = self.run_of(c, step_id, run_id)
                if params["run_id"] is None:
                    raise StepNotFound(step_id=step_id)
                for statement in self._db.sql.record_attempt(status):
                    written = self._db.run(c, statement, params).rowcount
                if not written:  # the attempt is written beside its step's row
                    raise StepNotFound(step_id=step_id)
        except StoreError as exc:
            if isinstance(exc.__cause__, sa_exc.IntegrityError):
                raise StepNotFound(step_id=step_id) from exc.__cause__
            raise

    def create_retry_attempt(
        self,
        step_id: str,
        status: NewAttemptStatus = "pending",
        *,
        reason: str = "retry",
        run_id: str | None = None,
        conn: sa.Connection | None = None,
    ) -> StepState:
        """Move the step to attempt n+1 and add that attempt's row, atomically.

        ``reason`` is recorded on the attempt: ``retry``, ``resume``, ``rerun``...
        ``run_id``: the step's run, if the caller knows it (else looked up by step id).
        """
        if status not in _NEW_ATTEMPT_STATUSES:
            raise InvalidStatus("new attempt", status, _NEW_ATTEMPT_STATUSES)
        params = {
            "run_id": run_id,
            "step_id": step_id,
            "now": now(),
            "history_id": new_id(),
            "reason": reason,
        }
        *first, moving = self._db.sql.next_attempt(status)
        with self._db.single(conn) as c:
            params["run_id"] = self.run_of(c, step_id, run_id)
            for statement in first:
                c.execute(statement, params)
            row = c.execute(moving, params).mappings().first()
        if row is None:
            raise StepNotFound(step_id=step_id)
        return StepState.from_row(row)

    def complete_run_if_done(self, run_id: str, *, conn: sa.Connection | None = None) -> bool:
        """Complete the run if every step of it has succeeded; its output is its last step's.

        The last step is the newest one that no other step follows.
        """
        params = {"run_id": run_id, "now": now()}
        with self._db.write(conn) as c:
            c.execute(sql.attempts.touch_run, params)
            return bool(c.execute(sql.attempts.complete_run_if_done, params).rowcount)

    def settle_run(
        self,
        run_id: str,
        status: str,
        error: ErrorLike | None = None,
        *,
        conn: sa.Connection | None = None,
    ) -> bool:
        """End a run that is still going as ``failed`` or ``cancelled``; a settled run stays."""
        if status not in ("failed", "cancelled"):
            raise InvalidStatus("settled run", status, frozenset({"failed", "cancelled"}))
        params = {
            "run_id": run_id,
            "new_status": status,
            "error": None if error is None else self._db.error_json(error),
            "now": now(),
        }
        with self._db.single(conn) as c:
            return bool(c.execute(sql.attempts.settle_run, params).rowcount)
