"""Concurrent writers on real PostgreSQL: several threads, several connections."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from tests.support import transitions
from tests.support.threads import run_threads


@pytest.fixture
def pg_store(pg_engine: sa.Engine) -> WorkflowStore:
    from tests.conftest import truncate

    truncate(pg_engine)
    return WorkflowStore(pg_engine)


def test_concurrent_writes_of_different_keys_lose_nothing(pg_store: WorkflowStore) -> None:
    run_id = pg_store.create_run("checkout", {})
    threads, writes = 8, 25

    def write(index: int) -> None:
        for n in range(writes):
            pg_store.update_run_state(run_id, f"t{index}.k{n}", {"n": n, "by": index})

    run_threads(threads, write)
    state = pg_store.get_run_state(run_id)
    assert len(state) == threads * writes
    assert state["t3.k7"] == {"n": 7, "by": 3}


def test_concurrent_transitions_of_one_attempt_converge(pg_store: WorkflowStore) -> None:
    run_id = pg_store.create_run("checkout", {})
    step_id = transitions.schedule(pg_store, run_id, "charge")
    order = ["scheduled", "running", "succeeded", "running", "scheduled", "succeeded"]

    def fire(index: int) -> None:
        status = order[index % len(order)]
        if status == "scheduled":
            transitions.dispatch(pg_store, step_id)
        elif status == "running":
            transitions.start(pg_store, step_id)
        else:
            transitions.succeed(pg_store, step_id, 1, "paid")

    run_threads(12, fire)
    [attempt] = pg_store.get_run_history(run_id)
    assert (attempt.status, attempt.result) == ("succeeded", "paid")
    assert pg_store.get_step_state(run_id, "charge").status == "succeeded"


def test_a_deadlock_is_a_conflict_to_run_again_not_an_unreachable_database(
    pg_store: WorkflowStore,
) -> None:
    from pikku_celery.errors import StoreConflict, StoreUnavailable
    from pikku_celery.schema import workflow_runs

    runs = [pg_store.create_run("pair", {}) for _ in range(2)]
    touch = sa.update(workflow_runs).values(inline=True)
    both_hold_one = threading.Barrier(2)
    outcomes: list[BaseException | None] = []

    def cross(index: int) -> None:
        first, second = runs[index], runs[1 - index]
        try:
            with pg_store.transaction() as conn:
                conn.execute(touch.where(workflow_runs.c.workflow_run_id == first))
                both_hold_one.wait()
                conn.execute(touch.where(workflow_runs.c.workflow_run_id == second))
            outcomes.append(None)
        except BaseException as exc:
            outcomes.append(exc)

    run_threads(2, cross)
    [lost] = [exc for exc in outcomes if exc is not None]
    assert isinstance(lost, StoreConflict) and not isinstance(lost, StoreUnavailable)
    assert "run it again" in str(lost)
