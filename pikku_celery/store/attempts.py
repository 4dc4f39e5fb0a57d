"""Writes addressed to attempt K of a step: what an event from a worker carries.

Each method is safe to call late, twice, or before the event that should have
come first; see ``sql.attempts`` for the rules that make that so.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from pikku_celery.durations import format_duration
from pikku_celery.errors import InvalidStatus, RunNotFound, StepNotFound, StoreError
from pikku_celery.store.base import UNSET, ErrorLike, StoreBase, _Unset, like_prefix, new_id, now
from pikku_celery.store.sql import attempts as aq
from pikku_celery.store.sql import workflow_store as q

__all__ = ["AttemptWrites", "NewRun"]

_ATTEMPT_EVENTS: Final = frozenset({"scheduled", "running", "succeeded", "failed", "cancelled"})
_ENDED: Final = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to create with a step, when the step is not part of one yet."""

    workflow: str
    input: Any
    wire: Any = None


class AttemptWrites(StoreBase):
    def schedule_step(
        self,
        run_id: str,
        step_id: str,
        step_name: str,
        rpc_name: str | None,
        data: Any,
        *,
        from_step_name: str | None = None,
        retries: int | None = None,
        retry_delay: float | str | dt.timedelta | None = None,
        eta: dt.datetime | None = None,
        task_id: str | None = None,
        new_run: NewRun | None = None,
        conn: sa.Connection | None = None,
    ) -> str | None:
        """Record a published step as scheduled (attempt 1), creating its run if asked.

        The step gets ``step_name``, or ``step_name#N`` when the run has that
        name already. Returns the name it got, or None when ``step_id`` was
        recorded before (a republish of the same message).
        """
        timestamp = now()
        params = {
            "run_id": run_id,
            "step_id": step_id,
            "base_name": step_name,
            "name_pattern": like_prefix(step_name, "#%"),
            "rpc_name": rpc_name,
            "data": self._json(data, f"input of step {step_name!r}"),
            "retries": retries,
            "retry_delay": None if retry_delay is None else format_duration(retry_delay),
            "from_step_name": from_step_name,
            "parent_step_id": None,
            "now": timestamp,
            "history_id": new_id(),
            "eta": eta,
            "task_id": task_id,
            "routing": None,
        }
        run_row = None
        if new_run is not None:
            params.update(
                run_workflow=new_run.workflow,
                run_input=self._json(new_run.input, "run input"),
                run_wire=None if new_run.wire is None else self._json(new_run.wire, "wire"),
            )
            run_row = {
                "workflow_run_id": run_id,
                "workflow": new_run.workflow,
                "status": "running",
                "input": params["run_input"],
                "state": "{}",
                "inline": False,
                "deterministic": False,
                "wire": params["run_wire"],
                "created_at": timestamp,
                "updated_at": timestamp,
            }
        for _ in range(20):  # each loop lost a race for a name to another publisher
            try:
                if self._pg:
                    with self._single(conn) as c:
                        statement = aq.schedule_step_pg(new_run is not None)
                        name = self._run_compiled(c, statement, params).scalar()
                        if name is not None:
                            return str(name)
                        if c.execute(q.step_exists, {"step_id": step_id}).first() is not None:
                            return None
                    continue
                with self._tx(conn) as c:
                    if run_row is not None:
                        c.execute(aq.insert_run_once(self.dialect), run_row)
                    name = c.execute(aq.schedule_step(self.dialect), params).scalar()
                    if name is not None:
                        c.execute(aq.schedule_attempt(self.dialect), params)
                        return str(name)
                    if c.execute(q.step_exists, {"step_id": step_id}).first() is not None:
                        return None
            except StoreError as exc:
                if isinstance(exc.__cause__, sa_exc.IntegrityError):
                    raise RunNotFound(run_id) from exc.__cause__
                raise
        raise StoreError(
            f"Could not find a free name for step {step_name!r} in run {run_id!r} after 20 "
            "tries; give the step an explicit name."
        )

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
        conn: sa.Connection | None = None,
    ) -> None:
        """Attempt ``attempt`` of the step moved to ``status``: both rows, no read first.

        ``at``: when it happened (default now).

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
            params["result"] = self._json(
                None if isinstance(result, _Unset) else result, "step result"
            )
        elif status in ("failed", "cancelled"):
            params["error"] = None if error is None else self._error_json(error)
        try:
            with self._single(conn) as c:
                if not self._pg:
                    c.execute(aq.record_attempt_step(status), params)
                if self._pg:
                    self._run_compiled(c, aq.record_attempt(self.dialect, status), params)
                else:
                    c.execute(aq.record_attempt(self.dialect, status), params)
        except StoreError as exc:
            if isinstance(exc.__cause__, sa_exc.IntegrityError):
                raise StepNotFound(step_id=step_id) from exc.__cause__
            raise

    def complete_run_if_done(self, run_id: str, *, conn: sa.Connection | None = None) -> bool:
        """Complete the run if every step of it has succeeded; its output is its last step's.

        The last step is the newest one that no other step follows.
        """
        params = {"run_id": run_id, "now": now()}
        with self._tx(conn) as c:
            c.execute(aq.touch_run, params)
            return bool(c.execute(aq.complete_run_if_done, params).rowcount)

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
            "error": None if error is None else self._error_json(error),
            "now": now(),
        }
        with self._single(conn) as c:
            return bool(c.execute(aq.settle_run, params).rowcount)
