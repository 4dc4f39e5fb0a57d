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
from pikku_celery.workflows.versions import Diverged, Undecided, VersionWatch

__all__ = ["Outcome", "parent_of", "replay"]

logger = logging.getLogger(__name__)

Outcome = Literal["settled", "waiting", "sleeping", "completed", "failed", "undecided"]
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
    moved = store.workflows.settle_workflow_run(
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
    foreign = not workflow.accepts(run.graph_hash)
    if foreign and workflow.pinned:
        conflict = VersionConflict(workflow.name, run.graph_hash, workflow.version, run_id=run_id)
        _settle(store, run, dispatcher, "failed", error=_conflict_document(conflict))
        return "failed"
    if run.status == "suspended":
        store.claims.move_run(run_id, "running", from_statuses=("suspended",))
    steps = {step.step_name: step for step in store.list_step_states(run_id)}
    watch = (
        VersionWatch(workflow.name, run_id, run.graph_hash, workflow.version, steps)
        if foreign
        else None
    )
    ctx = WorkflowContext(store, run_id, steps, dict(run.state), dispatcher, watch)
    call = run.input if isinstance(run.input, dict) else {}
    try:
        output = _walk(workflow, ctx, call)
    except Suspend:
        if ctx.sleeping:
            store.claims.move_run(run_id, "suspended", from_statuses=("running",))
            return "sleeping"
        return "waiting"
    except Diverged as diverged:
        logger.warning(
            "workflow %s run %s failed: %s",
            workflow.name,
            run_id,
            diverged.conflict,
            extra={"action": "version_conflict", "run_id": run_id},
        )
        _settle(store, run, dispatcher, "failed", error=_conflict_document(diverged.conflict))
        return "failed"
    except Undecided as undecided:
        # Never failed on a doubt: a worker of the run's own version (or this one, told
        # by compatible=) can still finish it; a resume or a worker's start replays it.
        logger.warning(
            "workflow %s run %s was started by version %s, and this worker's version %s "
            "cannot tell whether it may take the run over: %s. The run stays suspended; "
            "finish it on a worker of version %s, or, if this version replays it as it "
            "is, declare compatible=[%r] and pikku.resume(%r).",
            workflow.name,
            run_id,
            run.graph_hash,
            workflow.version,
            undecided.reason,
            run.graph_hash,
            run.graph_hash,
            run_id,
            extra={"action": "version_undecided", "run_id": run_id},
        )
        store.claims.move_run(run_id, "suspended", from_statuses=("running",))
        return "undecided"
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


def _walk(workflow: Workflow, ctx: WorkflowContext, call: dict[str, Any]) -> Any:
    """Run the workflow function once; under a version watch, its end is judged too."""
    watch = ctx.watch
    try:
        output = workflow.fn(ctx, *call.get("args", []), **call.get("kwargs", {}))
    except StepFailed as exc:
        if watch is not None:
            watch.beyond(f"ends the run with step {exc.step_name!r}'s failure")
        raise
    except Exception as exc:
        if watch is not None:
            watch.own_error(exc)
        raise
    if watch is not None:
        watch.beyond("ends the run")
    return output


def _conflict_document(conflict: VersionConflict) -> dict[str, Any]:
    document = error_document(conflict)
    document["code"] = VersionConflict.code
    if conflict.step is not None:
        document["step"] = conflict.step
    return document
