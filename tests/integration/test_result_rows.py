"""Celery's view of a task in ``pikku_celery_results``: forward only, written with its attempt.

Written through the mirror's batch path, on SQLite and PostgreSQL, as the worker's
journal delivers them: late, twice, and out of order.
"""

from __future__ import annotations

import datetime as dt
import uuid

from pikku_celery.store import MirrorBatch, ResultWrite, WorkflowStore, now
from tests.support.transitions import apply, new_step, start


def _write(store: WorkflowStore, task_id: str, attempt: int | None, status: str) -> None:
    row = ResultWrite(task_id, attempt, status, f"{status}@{attempt}".encode(), now())
    store.batches.apply_batch(MirrorBatch(results=[row]))


def _state(store: WorkflowStore, task_id: str) -> tuple[str, bytes] | None:
    stored = store.results.get(task_id)
    return None if stored is None else (stored.status, stored.meta)


def test_a_ready_state_is_final_within_its_attempt(store: WorkflowStore) -> None:
    task_id = str(uuid.uuid4())
    _write(store, task_id, 1, "STARTED")
    _write(store, task_id, 1, "SUCCESS")
    _write(store, task_id, 1, "STARTED")  # late
    _write(store, task_id, 1, "FAILURE")  # a duplicate delivery's outcome
    assert _state(store, task_id) == ("SUCCESS", b"SUCCESS@1")


def test_a_later_attempt_replaces_an_earlier_one_and_never_the_other_way(
    store: WorkflowStore,
) -> None:
    task_id = str(uuid.uuid4())
    _write(store, task_id, 1, "RETRY")
    _write(store, task_id, 2, "STARTED")
    _write(store, task_id, 1, "STARTED")  # attempt 1's start, written late
    assert _state(store, task_id) == ("STARTED", b"STARTED@2")
    _write(store, task_id, 2, "FAILURE")
    _write(store, task_id, 3, "SUCCESS")  # a new delivery after a resume
    assert _state(store, task_id) == ("SUCCESS", b"SUCCESS@3")


def test_a_revoke_from_outside_the_task_ends_the_current_attempt_once(
    store: WorkflowStore,
) -> None:
    task_id = str(uuid.uuid4())
    _write(store, task_id, 2, "STARTED")
    _write(store, task_id, None, "REVOKED")
    assert _state(store, task_id) == ("REVOKED", b"REVOKED@None")
    _write(store, task_id, 2, "SUCCESS")  # the killed body cannot overwrite it
    assert _state(store, task_id) == ("REVOKED", b"REVOKED@None")


def test_a_result_waits_with_a_step_that_is_not_in_sql_yet(store: WorkflowStore) -> None:
    """Never visible before its attempt: a result whose step waits in the journal waits too."""
    run_id = store.create_run("lone", {})
    step = new_step(store, run_id, "add", parent_step_id=str(uuid.uuid4()))  # parent missing
    row = ResultWrite(step.step_id, 1, "SUCCESS", b"5", now())
    # The step cannot be placed yet: the step it follows is not in SQL.
    result = store.batches.apply_batch(MirrorBatch(steps=[step], results=[row]))
    assert step.step_id in result.missing
    assert store.results.get(step.step_id) is None


def test_results_expire_in_batches_and_forget_removes_one(store: WorkflowStore) -> None:
    old = [str(uuid.uuid4()) for _ in range(5)]
    long_ago = now() - dt.timedelta(days=2)
    store.results.write([ResultWrite(t, 1, "SUCCESS", b"x", long_ago) for t in old])
    fresh = str(uuid.uuid4())
    _write(store, fresh, 1, "SUCCESS")
    cutoff = now() - dt.timedelta(days=1)
    assert store.results.expire(cutoff, limit=3) == 3
    assert store.results.expire(cutoff, limit=3) == 2
    assert store.results.expire(cutoff, limit=3) == 0
    assert store.results.get_many([*old, fresh]).keys() == {fresh}
    assert store.results.forget(fresh) and not store.results.forget(fresh)


def test_a_running_step_and_its_result_are_written_together(store: WorkflowStore) -> None:
    run_id = store.create_run("lone", {})
    step = new_step(store, run_id, "add")
    apply(store, steps=[step])
    start(store, step.step_id)
    _write(store, step.step_id, 1, "STARTED")
    [attempt] = store.get_run_history(run_id)
    assert attempt.status == "running"
    assert _state(store, step.step_id) == ("STARTED", b"STARTED@1")
