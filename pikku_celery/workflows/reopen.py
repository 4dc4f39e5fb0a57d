"""Reopening a run: new attempts for some of its steps, and the run running again.

Shared by ``resume`` and ``rerun`` and by a parent whose child run must go on.
The caller sends the replay once this has committed.
"""

from __future__ import annotations

from typing import Final

from pikku_celery.errors import StepNotFound
from pikku_celery.store import WorkflowStore

__all__ = ["reopen"]

_RESUMABLE: Final[tuple[str, ...]] = ("failed", "cancelled", "suspended", "running")
_RERUNNABLE: Final[tuple[str, ...]] = ("completed", *_RESUMABLE)


def reopen(
    store: WorkflowStore,
    run_id: str,
    *,
    from_step: str | None = None,
    rerun_completed: bool = False,
) -> list[str]:
    """Make steps pending again; returns their names.

    Without ``from_step``: the failed and cancelled steps (a resume). With it:
    that step and every step after it (a rerun). ``rerun_completed``: a
    completed run is rerun from its first step instead of left as it is.
    """
    steps = store.list_step_states(run_id)
    names = [step.step_name for step in steps]
    if from_step is not None:
        if from_step not in names:
            raise StepNotFound(
                run_id=run_id,
                step_name=from_step,
                hint=f"the run's steps are {', '.join(names) or 'none yet'}",
            )
        again = steps[names.index(from_step) :]
        reason, from_statuses = "rerun", _RERUNNABLE
    elif rerun_completed and store.get_run(run_id).status == "completed":
        again, reason, from_statuses = steps, "rerun", _RERUNNABLE
    else:
        again = [s for s in steps if s.status in ("failed", "cancelled")]
        reason, from_statuses = "resume", _RESUMABLE
    with store.transaction() as conn:
        for step in again:
            store.attempts.create_retry_attempt(
                step.step_id, "pending", reason=reason, run_id=step.run_id, conn=conn
            )
        store.claims.move_run(run_id, "running", from_statuses=from_statuses, conn=conn)
    return [step.step_name for step in again]
