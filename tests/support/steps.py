"""Steps in a given state, made through the store's own writes (for the reaper's tests)."""

from __future__ import annotations

import datetime as dt
import uuid

from pikku_celery import WorkflowStore
from pikku_celery.store.attempts import NewRun
from tests.support import transitions

#: The error the reaper writes on a lost attempt, as the tests use it.
LOST = {
    "type": "pikku_celery.WorkerLost",
    "message": "gone",
    "worker": "w1@host",
    "pid": 7,
    "lost_at": "2026-01-01T12:00:00+00:00",
    "redelivery_expected": False,
}


def scheduled_step(
    store: WorkflowStore, *, retries: int | None = 1, eta: dt.datetime | None = None
) -> tuple[str, str]:
    """A lone task's run and its step, published: ``(run_id, step_id)``."""
    run_id, step_id = str(uuid.uuid4()), str(uuid.uuid4())
    transitions.schedule(
        store,
        run_id,
        "charge",
        step_id=step_id,
        rpc_name="shop.charge",
        data={"args": [1], "kwargs": {}},
        retries=retries,
        eta=eta,
        new_run=NewRun("charge", {"card": "secret"}, {"type": "task"}),
    )
    return run_id, step_id


def running_step(store: WorkflowStore, *, retries: int | None = 1) -> tuple[str, str]:
    """Attempt 1 running on worker ``w1@host``, pid 7."""
    run_id, step_id = scheduled_step(store, retries=retries)
    store.attempts.record_attempt(step_id, 1, "running", worker="w1@host", pid=7, task_id=step_id)
    return run_id, step_id


def lost_step(store: WorkflowStore) -> tuple[str, str]:
    """Attempt 1 lost with its worker."""
    run_id, step_id = running_step(store)
    assert store.reaping.mark_lost(step_id, 1, 1, LOST)
    return run_id, step_id
