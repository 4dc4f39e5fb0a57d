"""Writes for what durable workflows add to steps: start ids, child runs, events, branches.

Each is one transaction guarded on the state it moves from, so concurrent
replays of a run (two workers, a redelivered replay) agree on one outcome.
"""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy as sa

from pikku_celery.errors import RunIdTaken, RunNotFound, RunSettled, StepNotFound
from pikku_celery.store import sql
from pikku_celery.store.attempts import Attempts
from pikku_celery.store.claims import Claims
from pikku_celery.store.common import UNSET, ErrorLike, Unset, new_id, now, run_day
from pikku_celery.store.connector import Connector
from pikku_celery.store.models import SETTLED_RUN_STATUSES, RunEvent

__all__ = ["Workflows", "child_error"]

_CHILD_ENDS: Final = {"completed": "succeeded", "failed": "failed", "cancelled": "cancelled"}


class Workflows:
    """What durable workflows add to runs and steps: starts, children, events, branches."""

    def __init__(self, db: Connector, attempts: Attempts, claims: Claims) -> None:
        self._db = db
        self._attempts = attempts
        self._claims = claims

    # --- starts --------------------------------------------------------------

    def start_run(
        self,
        workflow: str,
        input: Any,
        *,
        run_id: str,
        graph_hash: str | None = None,
        wire: Any = None,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Create the run under ``run_id`` unless it exists; True when this call made it.

        Of any number of concurrent starts with one id, exactly one gets True.
        A run of another workflow under that id is :class:`RunIdTaken`.
        """
        timestamp = now()
        row = {
            "workflow_run_id": run_id,
            "workflow": workflow,
            "status": "running",
            "input": self._db.json(input, "run input"),
            "state": "{}",
            "inline": False,
            "graph_hash": graph_hash,
            "deterministic": False,
            "planned_steps": None,
            "wire": None if wire is None else self._db.json(wire, "wire"),
            "created_at": timestamp,
            "updated_at": timestamp,
            "run_day": run_day(timestamp),
        }
        with self._db.write(conn) as c:
            if c.execute(self._db.sql.insert_run_if_absent, row).first() is not None:
                return True
            existing = c.execute(sql.workflows.run_status, {"run_id": run_id}).first()
        if existing is not None and existing.workflow != workflow:
            raise RunIdTaken(run_id, workflow, existing.workflow)
        return False

    # --- child runs ----------------------------------------------------------

    def start_child(
        self,
        run_id: str,
        step_id: str,
        step_name: str,
        rpc_name: str,
        data: Any,
        *,
        child_run_id: str,
        child_workflow: str,
        graph_hash: str | None,
        from_step_name: str | None = None,
    ) -> bool:
        """Claim the parent's step and create its child run, in one transaction.

        The step is ``running`` with the child's id as its attempt's task id.
        False when another replay claimed the step first (it started the child).
        """
        wire = {
            "type": "workflow",
            "parent_run_id": run_id,
            "parent_step_id": step_id,
            "parent_step_name": step_name,
        }
        with self._db.write(None) as c:
            if not self._claims.claim_step(
                run_id, step_id, step_name, rpc_name, data, from_step_name=from_step_name, conn=c
            ):
                return False
            self.start_run(
                child_workflow, data, run_id=child_run_id, graph_hash=graph_hash, wire=wire, conn=c
            )
            c.execute(
                sql.workflows.set_child_run,
                {"run_id": run_id, "step_id": step_id, "child_run_id": child_run_id},
            )
            self._attempts.record_attempt(
                step_id, 1, "running", task_id=child_run_id, run_id=run_id, conn=c
            )
        return True

    def end_child(
        self,
        parent_step_id: str,
        child_run_id: str,
        status: str,
        *,
        output: Any = UNSET,
        error: ErrorLike | None = None,
        conn: sa.Connection | None = None,
    ) -> bool:
        """The parent's step takes the child run's end (``completed``, ``failed``,
        ``cancelled``); False when that step is not waiting on this child."""
        with self._db.write(conn) as c:
            try:
                step = self._claims.get_step(parent_step_id, conn=c)
            except StepNotFound:
                return False  # the parent was pruned: nobody is waiting
            if step.child_run_id != child_run_id or step.status in ("succeeded", "failed"):
                return False
            self._attempts.record_attempt(
                parent_step_id,
                step.attempt_count,
                _CHILD_ENDS[status],
                result=None if isinstance(output, Unset) else output,
                error=error,
                run_id=step.run_id,
                conn=c,
            )
        return True

    def settle_workflow_run(
        self,
        run_id: str,
        status: str,
        *,
        from_statuses: tuple[str, ...],
        output: Any = UNSET,
        error: ErrorLike | None = None,
        parent_step_id: str | None = None,
    ) -> bool:
        """Move the run to its end and, for a child run, its parent's step with it.

        One transaction: a parent never waits on a child that has ended.
        """
        with self._db.write(None) as c:
            moved = self._claims.move_run(
                run_id, status, from_statuses=from_statuses, output=output, error=error, conn=c
            )
            if moved and parent_step_id is not None:
                self.end_child(
                    parent_step_id,
                    run_id,
                    status,
                    output=output,
                    error=None if error is None else child_error(run_id, status, error),
                    conn=c,
                )
        return moved

    # --- branches ------------------------------------------------------------

    def set_branch_taken(
        self, step_id: str, branch: str, *, conn: sa.Connection | None = None
    ) -> None:
        """Record the branch the workflow took after the step (``branch_taken``)."""
        with self._db.single(conn) as c:
            result = c.execute(
                sql.workflows.set_branch_taken,
                {
                    "run_id": self._attempts.run_of(c, step_id, None),
                    "step_id": step_id,
                    "branch": branch,
                    "now": now(),
                },
            )
            if result.rowcount == 0:
                raise StepNotFound(step_id=step_id)

    # --- events --------------------------------------------------------------

    def send_event(self, run_id: str, name: str, data: Any = None) -> str:
        """Keep an event for the run's ``ctx.wait_for(name)``; returns the event's id.

        An unknown run is :class:`RunNotFound`, an ended one :class:`RunSettled`.
        """
        if not name:
            raise ValueError("An event needs a name, the one its ctx.wait_for(name) waits for.")
        row = {
            "event_id": new_id(),
            "workflow_run_id": run_id,
            "name": name,
            "data": self._db.json(data, f"data of event {name!r}"),
            "sent_at": now(),
            "taken_by_step_id": None,
            "taken_at": None,
        }
        with self._db.write(None) as c:
            run = c.execute(sql.workflows.run_status, {"run_id": run_id}).first()
            if run is None:
                raise RunNotFound(run_id)
            if run.status in SETTLED_RUN_STATUSES:
                raise RunSettled(run_id, run.status)
            c.execute(sql.workflows.insert_event, {**row, "run_day": run.run_day})
        return str(row["event_id"])

    def take_event(self, run_id: str, step_id: str, attempt: int, name: str) -> tuple[bool, Any]:
        """``(True, data)`` when the waiting step took the oldest event of ``name`` now.

        ``(False, None)`` when there is none, or when the wait has ended
        already (another replay delivered an event, or it timed out).
        """
        guard = {"run_id": run_id, "step_id": step_id, "attempt_no": attempt, "now": now()}
        try:
            with self._db.write(None) as c:
                if c.execute(sql.workflows.hold_open_step, guard).rowcount == 0:
                    raise _Nothing
                while True:
                    event = c.execute(
                        sql.workflows.next_untaken_event, {"run_id": run_id, "name": name}
                    ).first()
                    if event is None:
                        raise _Nothing  # rolls the guard back: nothing changed
                    taken = c.execute(
                        sql.workflows.take_event,
                        {
                            "run_id": run_id,
                            "the_event": event.event_id,
                            "step_id": step_id,
                            "now": now(),
                        },
                    )
                    if taken.rowcount:
                        break
                self._attempts.record_attempt(
                    step_id, attempt, "succeeded", result=event.data, run_id=run_id, conn=c
                )
        except _Nothing:
            return False, None
        return True, event.data

    def restart_wait(self, step_id: str, attempt: int, data: Any) -> bool:
        """A wait made pending again (resume, rerun) waits anew: True for the replay
        that took it, which has set the step's data (its new deadline)."""
        with self._db.write(None) as c:
            if not self._claims.take_pending_step(step_id, attempt, conn=c):
                return False
            c.execute(
                sql.workflows.set_step_data,
                {
                    "run_id": self._attempts.run_of(c, step_id, None),
                    "step_id": step_id,
                    "data": self._db.json(data, "input of a wait"),
                },
            )
        return True

    def time_out_wait(self, step_id: str, attempt: int, error: ErrorLike) -> bool:
        """Fail the waiting step with its timeout, unless its wait has ended already."""
        guard: dict[str, Any] = {"step_id": step_id, "attempt_no": attempt, "now": now()}
        try:
            with self._db.write(None) as c:
                run_id = guard["run_id"] = self._attempts.run_of(c, step_id, None)
                if c.execute(sql.workflows.hold_open_step, guard).rowcount == 0:
                    raise _Nothing
                self._attempts.record_attempt(
                    step_id, attempt, "failed", error=error, run_id=run_id, conn=c
                )
        except _Nothing:
            return False
        return True

    def list_events(self, run_id: str, *, conn: sa.Connection | None = None) -> list[RunEvent]:
        """Every event sent to the run, oldest first, taken or not."""
        with self._db.read(conn) as c:
            rows = c.execute(sql.workflows.list_events, {"run_id": run_id}).mappings().all()
        return [RunEvent.from_row(row) for row in rows]


class _Nothing(Exception):
    """Nothing to do after all: the transaction is rolled back."""


def child_error(run_id: str, status: str, error: ErrorLike) -> dict[str, Any]:
    """The parent step's error for a child run that failed or was cancelled."""
    cause = dict(error) if isinstance(error, dict) else {"message": str(error)}
    return {
        "type": "pikku_celery.ChildRunFailed",
        "message": f"child run {run_id} {status}: {cause.get('message') or 'no message'}",
        "child_run_id": run_id,
        "cause": cause,
        "traceback": None,
    }
