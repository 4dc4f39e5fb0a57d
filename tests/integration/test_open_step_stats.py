"""``count_open_steps``: lost, running and stale scheduled steps in one read, on both databases."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.store.stats import OpenStepCounts
from tests.support.plans import index_and_partitions
from tests.support.steps import LOST, lost_step, running_step, scheduled_step

HOUR = 3600.0


def later(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)


def test_an_empty_store_has_nothing_open(store: WorkflowStore) -> None:
    assert store.count_open_steps(600) == OpenStepCounts(lost=0, running=0, stale_scheduled=0)


def test_each_open_status_is_counted_and_finished_steps_are_not(store: WorkflowStore) -> None:
    running_step(store)
    running_step(store)
    lost_step(store)
    scheduled_step(store)
    _, done = running_step(store)
    store.attempts.record_attempt(done, 1, "succeeded", result=1)
    _, failed = running_step(store)
    store.attempts.record_attempt(failed, 1, "failed", error={"type": "E", "message": "no"})

    # Just scheduled: not stale yet, but it is once the threshold has passed.
    assert store.count_open_steps(600) == OpenStepCounts(lost=1, running=2, stale_scheduled=0)
    assert store.count_open_steps(600, at=later(601)) == OpenStepCounts(
        lost=1, running=2, stale_scheduled=1
    )


def test_a_message_held_back_by_its_eta_is_not_stale_until_then(store: WorkflowStore) -> None:
    scheduled_step(store, eta=later(3 * HOUR))
    assert store.count_open_steps(600, at=later(2 * HOUR)).stale_scheduled == 0
    assert store.count_open_steps(600, at=later(4 * HOUR)).stale_scheduled == 1


def test_the_count_agrees_with_the_list_the_reaper_reports(store: WorkflowStore) -> None:
    scheduled_step(store)
    scheduled_step(store)
    scheduled_step(store, eta=later(HOUR))
    running_step(store)
    listed = store.reaping.stale_scheduled(older_than=0)
    assert len(listed) == 2
    assert store.count_open_steps(0).stale_scheduled == len(listed)


def test_a_lost_step_given_up_or_redelivered_is_no_longer_lost(store: WorkflowStore) -> None:
    run_id, given_up = lost_step(store)
    # Retried as attempt 2: scheduled again, as fresh as its new attempt.
    assert store.reaping.give_up_lost(run_id, given_up, 1, LOST, retry=True, settle_run=False)
    _, redelivered = lost_step(store)
    store.attempts.record_attempt(redelivered, 1, "running", worker="w2@host", task_id=redelivered)
    failed_run, failed = lost_step(store)
    assert store.reaping.give_up_lost(failed_run, failed, 1, LOST, retry=False, settle_run=True)
    assert store.count_open_steps(600) == OpenStepCounts(lost=0, running=1, stale_scheduled=0)
    assert store.count_open_steps(600, at=later(601)).stale_scheduled == 1


def test_lost_steps_by_run(store: WorkflowStore) -> None:
    lost_run, _ = lost_step(store)
    busy_run, _ = running_step(store)
    assert store.lost_steps_by_run([lost_run, busy_run, lost_run, "no-such-run"]) == {lost_run: 1}
    assert store.lost_steps_by_run([]) == {}


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 1e300])
def test_a_bad_threshold_is_a_clear_error(store: WorkflowStore, bad: float) -> None:
    with pytest.raises(ValueError, match="stale_after"):
        store.count_open_steps(bad)


@contextmanager
def statements(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """The SQL text and parameters the driver is given, as sent."""
    seen: list[tuple[str, Any]] = []

    def record(*args: Any) -> None:
        _conn, _cursor, statement, parameters = args[:4]
        seen.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def test_the_count_reads_through_the_open_steps_partial_index(store: WorkflowStore) -> None:
    running_step(store)
    lost_step(store)
    with statements(store.engine) as seen:
        store.count_open_steps(600)
    [(statement, parameters)] = seen
    # The status list is in the text itself: a planner can only match a
    # partial index's condition against values it can see.
    assert "'scheduled', 'running', 'lost'" in statement
    with store.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # A table this small is read whole anyway; what matters is that the index can serve.
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            plan = conn.exec_driver_sql(f"EXPLAIN {statement}", parameters).scalars().all()
        else:
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
            plan = [str(row[-1]) for row in rows]
        index = index_and_partitions(conn, "idx_workflow_step_open")
    assert any(name in line for line in plan for name in index), plan
