"""Steps and attempts written the way the mirror writes them: as store batches.

Each function builds the :class:`MirrorBatch` that ``mirror.apply`` plans for
one event (JSON already encoded by the store's codec, aware UTC times, a task id
on every published attempt, a retry delay in seconds) and hands it to the store
in one transaction. Bad input fails before anything is sent: in the codec
(``SerializationError``, ``PayloadTooLarge``) or in ``format_duration``
(``InvalidDuration``, as the store's own ``claims`` refuse a delay). A step the
database does not have is not an error here either: it is in the returned
``BatchResult.missing``, and nothing of it is written.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, Literal

import sqlalchemy as sa

from pikku_celery.durations import format_duration, parse_duration
from pikku_celery.store import (
    NEXT_ATTEMPT_GAP,
    ErrorLike,
    MirrorBatch,
    NewRun,
    NewStep,
    RunOutcome,
    StepTransition,
    WorkflowStore,
    error_document,
    now,
)
from pikku_celery.store.mirror_batch import BatchResult

__all__ = [
    "apply",
    "dispatch",
    "fail",
    "new_step",
    "retry",
    "schedule",
    "start",
    "succeed",
]


def apply(
    store: WorkflowStore,
    *,
    steps: Sequence[NewStep] = (),
    transitions: Sequence[StepTransition] = (),
    outcomes: Sequence[RunOutcome] = (),
    conn: sa.Connection | None = None,
) -> BatchResult:
    """One batch, in one transaction (``conn``'s, if given)."""
    batch = MirrorBatch(steps=list(steps), transitions=list(transitions), outcomes=list(outcomes))
    return store.batches.apply_batch(batch, conn=conn)


def _seconds(delay: float | str | dt.timedelta | None) -> float | None:
    """A delay in any form ``format_duration`` takes, as the seconds a batch carries."""
    return None if delay is None else parse_duration(format_duration(delay)).total_seconds()


def _error_json(store: WorkflowStore, error: ErrorLike) -> str:
    return store.codec.encode(error_document(error), "error")


def new_step(
    store: WorkflowStore,
    run_id: str,
    step_name: str,
    *,
    rpc_name: str | None = None,
    data: Any = None,
    step_id: str | None = None,
    parent_step_id: str | None = None,
    retries: int | None = None,
    retry_delay: float | str | dt.timedelta | None = None,
    eta: dt.datetime | None = None,
    new_run: NewRun | None = None,
    at: dt.datetime | None = None,
) -> NewStep:
    """A published step, not written yet (``new_run``: the run a lone task makes)."""
    data_json = store.codec.encode(data, f"input of step {step_name!r}")
    run_input_json = run_wire_json = None
    if new_run is not None:
        run_input_json = (
            data_json if new_run.input is data else store.codec.encode(new_run.input, "run input")
        )
        if new_run.wire is not None:
            run_wire_json = store.codec.encode(new_run.wire, "wire")
    return NewStep(
        run_id=run_id,
        step_id=step_id or str(uuid.uuid4()),
        step_name=step_name,
        rpc_name=rpc_name,
        data_json=data_json,
        at=at or now(),
        parent_step_id=parent_step_id,
        retries=retries,
        retry_delay=_seconds(retry_delay),
        eta=eta,
        run_workflow=None if new_run is None else new_run.workflow,
        run_input_json=run_input_json,
        run_wire_json=run_wire_json,
    )


def schedule(
    store: WorkflowStore,
    run_id: str,
    step_name: str,
    *,
    rpc_name: str | None = None,
    data: Any = None,
    step_id: str | None = None,
    parent_step_id: str | None = None,
    retries: int | None = None,
    retry_delay: float | str | dt.timedelta | None = None,
    eta: dt.datetime | None = None,
    new_run: NewRun | None = None,
    at: dt.datetime | None = None,
    conn: sa.Connection | None = None,
) -> str:
    """Publish a step: scheduled, attempt 1, task id = step id; returns its id.

    It gets ``step_name``, or ``step_name#N`` when the run has that name already.
    Its run (unless ``new_run``) and its parent must exist: a step that could not
    be written fails the test here.
    """
    step = new_step(
        store,
        run_id,
        step_name,
        rpc_name=rpc_name,
        data=data,
        step_id=step_id,
        parent_step_id=parent_step_id,
        retries=retries,
        retry_delay=retry_delay,
        eta=eta,
        new_run=new_run,
        at=at,
    )
    result = apply(store, steps=[step], conn=conn)
    assert step.step_id not in result.missing, f"step {step_name!r} was not written"
    return step.step_id


def dispatch(
    store: WorkflowStore,
    step_id: str,
    attempt: int = 1,
    *,
    at: dt.datetime | None = None,
    conn: sa.Connection | None = None,
) -> BatchResult:
    """The message of attempt ``attempt`` is out: it is scheduled, with its task id."""
    moment = at or now()
    transition = StepTransition(step_id, attempt, "scheduled", moment, task_id=step_id)
    return apply(store, transitions=[transition], conn=conn)


def start(
    store: WorkflowStore,
    step_id: str,
    attempt: int = 1,
    *,
    worker: str | None = None,
    pid: int | None = None,
    at: dt.datetime | None = None,
    conn: sa.Connection | None = None,
) -> BatchResult:
    """A worker starts attempt ``attempt``: running, one more delivery of its message."""
    moment = at or now()
    transition = StepTransition(
        step_id,
        attempt,
        "running",
        moment,
        running_at=moment,
        task_id=step_id,
        worker=worker,
        pid=pid,
        reason="first" if attempt == 1 else "retry",
        delivery_ids=(str(uuid.uuid4()),),
    )
    return apply(store, transitions=[transition], conn=conn)


def succeed(
    store: WorkflowStore,
    step_id: str,
    attempt: int,
    result: Any,
    *,
    at: dt.datetime | None = None,
    conn: sa.Connection | None = None,
) -> BatchResult:
    """Attempt ``attempt`` succeeded; its run completes if every step of it has."""
    moment = at or now()
    transition = StepTransition(
        step_id,
        attempt,
        "succeeded",
        moment,
        ended_at=moment,
        result_json=store.codec.encode(result, "step result"),
    )
    outcome = RunOutcome(step_id, None, "complete", moment)
    return apply(store, transitions=[transition], outcomes=[outcome], conn=conn)


def fail(
    store: WorkflowStore,
    step_id: str,
    attempt: int | None,
    error: ErrorLike,
    *,
    status: Literal["failed", "cancelled"] = "failed",
    at: dt.datetime | None = None,
    conn: sa.Connection | None = None,
) -> BatchResult:
    """Attempt ``attempt`` (None: the step's current one) ended for good; so does its run."""
    moment = at or now()
    error_json = _error_json(store, error)
    transition = StepTransition(
        step_id,
        attempt,
        status,
        moment,
        ended_at=moment,
        error_json=error_json,
        gave_up=status == "failed",
    )
    outcome = RunOutcome(step_id, None, status, moment, error_json)
    return apply(store, transitions=[transition], outcomes=[outcome], conn=conn)


def retry(
    store: WorkflowStore,
    step_id: str,
    attempt: int,
    error: ErrorLike,
    *,
    eta: dt.datetime | None = None,
    retries: int | None = None,
    retry_delay: float | str | dt.timedelta | None = None,
    at: dt.datetime | None = None,
    conn: sa.Connection | None = None,
) -> BatchResult:
    """Attempt ``attempt`` failed and attempt ``attempt + 1`` is scheduled (Celery's retry)."""
    moment = at or now()
    failed = StepTransition(
        step_id,
        attempt,
        "failed",
        moment,
        ended_at=moment,
        error_json=_error_json(store, error),
    )
    # Strictly after the failure it follows, as the mirror writes it.
    following = moment + NEXT_ATTEMPT_GAP
    scheduled = StepTransition(
        step_id,
        attempt + 1,
        "scheduled",
        following,
        scheduled_at=following,
        task_id=step_id,
        eta=eta,
        reason="retry",
        retries=retries,
        retry_delay=_seconds(retry_delay),
    )
    return apply(store, transitions=[failed, scheduled], conn=conn)
