"""What the mirror writes for lone Celery tasks, as batches and as signal events.

A lone task is published, started and succeeded: to the mirror a new step
(with its run), one coalesced transition running and succeeded (with one
counted delivery) and a run outcome, which is what its planner makes of the
three events when they land in one flush.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Sequence
from typing import Final

from pikku_celery.mirror import PublishedStep, Recorder
from pikku_celery.store import (
    MirrorBatch,
    NewRun,
    NewStep,
    RunOutcome,
    StepTransition,
    WorkflowStore,
)

__all__ = [
    "TASK_TRANSITIONS",
    "apply_batches",
    "lone_task_batch",
    "mirror_tasks",
    "new_ids",
    "published_steps",
    "transition",
]

TASK_TRANSITIONS: Final = 3  # publish (scheduled), running, succeeded
TASK_INPUT: Final = {"args": [1], "kwargs": {}}
TASK_WIRE: Final = {"type": "task"}
RESULT: Final = {"ok": 1}
WORKER: Final = "bench@localhost"


def new_ids(count: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(count)]


def transition(
    store: WorkflowStore, step_id: str, status: str, at: dt.datetime, started: dt.datetime
) -> StepTransition:
    """Attempt 1 of ``step_id`` running (``started``) or ended at ``at``, as a worker reports it."""
    ended = status != "running"
    return StepTransition(
        step_id=step_id,
        attempt=1,
        status=status,
        at=at,
        running_at=started,
        ended_at=at if ended else None,
        result_json=store.codec.encode(RESULT, "bench result") if status == "succeeded" else None,
        task_id=step_id,
        worker=WORKER,
        pid=os.getpid(),
        reason="first",
        delivery_ids=(str(uuid.uuid4()),),
    )


def lone_task_batch(
    store: WorkflowStore, workflow: str, step_ids: Sequence[str], *, finished: bool = True
) -> MirrorBatch:
    """One group commit of lone tasks: published, and unless not ``finished``, run and succeeded.

    Every JSON value is encoded by the store's codec first, as the mirror's
    planner hands it over.
    """
    data = store.codec.encode(TASK_INPUT, "bench input")
    wire = store.codec.encode(TASK_WIRE, "bench wire")
    batch = MirrorBatch()
    for step_id in step_ids:
        published = dt.datetime.now(dt.timezone.utc)
        batch.steps.append(
            NewStep(
                run_id=step_id,
                step_id=step_id,
                step_name="task",
                rpc_name=workflow,
                data_json=data,
                at=published,
                run_workflow=workflow,
                run_input_json=data,
                run_wire_json=wire,
            )
        )
        if not finished:
            continue
        started = published + dt.timedelta(microseconds=100)
        ended = started + dt.timedelta(microseconds=100)
        batch.transitions.append(transition(store, step_id, "succeeded", ended, started))
        batch.outcomes.append(RunOutcome(step_id, step_id, "complete", ended))
    return batch


def apply_batches(store: WorkflowStore, batches: Sequence[MirrorBatch]) -> None:
    for batch in batches:
        result = store.batches.apply_batch(batch)
        if result.missing:
            raise RuntimeError(f"apply_batch missed {len(result.missing)} steps")


def published_steps(workflow: str, count: int) -> list[PublishedStep]:
    """What a publisher's signal handler hands the mirror for ``count`` lone tasks."""
    return [
        PublishedStep(
            run_id=step_id,
            step_id=step_id,
            step_name="task",
            rpc_name=workflow,
            data=TASK_INPUT,
            new_run=NewRun(workflow, TASK_INPUT, TASK_WIRE),
        )
        for step_id in new_ids(count)
    ]


def mirror_tasks(mirror: Recorder, steps: Sequence[PublishedStep]) -> None:
    """Every signal's event journaled, then one flush: the whole path to COMMIT."""
    pid = os.getpid()
    for step in steps:
        mirror.published(step)
        mirror.started(step.step_id, 1, worker=WORKER, pid=pid)
        mirror.succeeded(step.run_id, step.step_id, 1, RESULT)
    if not mirror.flush():
        raise RuntimeError("the mirror could not flush its journal")
