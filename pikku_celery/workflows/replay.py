"""One replay of a run: walk the workflow function against what the store knows.

Knows nothing of Celery: messages go through a :class:`Dispatcher`.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Literal

from pikku_celery.errors import SerializationError, StepFailed, VersionConflict
from pikku_celery.store import (
    SETTLED_RUN_STATUSES,
    UNSET,
    ErrorLike,
    WorkflowRun,
    WorkflowStore,
    error_document,
)
from pikku_celery.workflows.context import Dispatcher, Suspend, WorkflowContext
from pikku_celery.workflows.definition import Workflow

__all__ = ["Outcome", "parent_of", "replay"]

logger = logging.getLogger(__name__)

Outcome = Literal["settled", "waiting", "sleeping", "completed", "failed"]
_GOING: Final = ("running", "suspended")


def parent_of(run: WorkflowRun) -> tuple[str, str] | None:
    """(parent run id, parent step id) of a child run, else None."""
    wire = run.wire if isinstance(run.wire, dict) else {}
    parent_run, parent_step = wire.get("parent_run_id"), wire.get("parent_step_id")
    if isinstance(parent_run, str) and isinstance(parent_step, str):
        return parent_run, parent_step
    return None


def _settle(
    store: WorkflowStore,
    run: WorkflowRun,
    dispatcher: Dispatcher,
    status: str,
    *,
    output: Any = UNSET,
    error: ErrorLike | None = None,
) -> None:
    """End the run; a child's end is its parent's step's end, and replays the parent."""
    parent = parent_of(run)
    moved = store.settle_workflow_run(
        run.run_id,
        status,
        from_statuses=_GOING,
        output=output,
        error=error,
        parent_step_id=None if parent is None else parent[1],
    )
    if moved and parent is not None:
        dispatcher.orchestrate(parent[0])


def replay(
    store: WorkflowStore,
    workflow: Workflow,
    run_id: str,
    dispatcher: Dispatcher,
    run: WorkflowRun | None = None,
) -> Outcome:
    """Replay the run once: stored results for finished steps, dispatch the next, stop.

    ``run`` is the run as just read, when the caller has it: no second read.
    """
    run = run if run is not None else store.get_run(run_id)
    if run.status in SETTLED_RUN_STATUSES:
        return "settled"
    if not workflow.accepts(run.graph_hash):
        conflict = VersionConflict(workflow.name, run.graph_hash, workflow.version)
        document = error_document(conflict)
        document["code"] = VersionConflict.code
        _settle(store, run, dispatcher, "failed", error=document)
        return "failed"
    if run.status == "suspended":
        store.move_run(run_id, "running", from_statuses=("suspended",))
    steps = {step.step_name: step for step in store.list_step_states(run_id)}
    ctx = WorkflowContext(store, run_id, steps, dict(run.state), dispatcher)
    call = run.input if isinstance(run.input, dict) else {}
    try:
        output = workflow.fn(ctx, *call.get("args", []), **call.get("kwargs", {}))
    except Suspend:
        if ctx.sleeping:
            store.move_run(run_id, "suspended", from_statuses=("running",))
            return "sleeping"
        return "waiting"
    except StepFailed as exc:
        document = error_document(exc)
        document.update(step=exc.step_name, cause=exc.error)
        _settle(store, run, dispatcher, "failed", error=document)
        return "failed"
    except Exception as exc:
        logger.info(
            "workflow %s run %s failed: %s",
            workflow.name,
            run_id,
            exc,
            extra={"action": "workflow_failed", "run_id": run_id},
        )
        _settle(store, run, dispatcher, "failed", error=error_document(exc))
        return "failed"
    try:
        _settle(store, run, dispatcher, "completed", output=output)
    except SerializationError as exc:
        _settle(store, run, dispatcher, "failed", error=error_document(exc))
        return "failed"
    return "completed"
