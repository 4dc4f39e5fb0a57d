"""``StorePrune``: old settled runs go a batch at a time, oldest first, with their steps and
attempts; nothing else goes. On SQLite and on PostgreSQL."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.errors import InvalidStatus
from pikku_celery.store.prune import PruneCount
from tests.conftest import truncate
from tests.support.plans import index_and_partitions
from tests.support.seed import add_runs

MONTH = dt.timedelta(days=30)


def cutoff() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) - MONTH


def test_a_batch_takes_the_oldest_runs_with_their_steps_and_attempts(
    store: WorkflowStore,
) -> None:
    old = add_runs(store, 10, age=MONTH + dt.timedelta(days=1))  # old[-1] is the oldest
    running = add_runs(store, 2, age=2 * MONTH, statuses=["running", "suspended"])
    recent = add_runs(store, 3, age=dt.timedelta(days=1))

    assert store.count_prunable(cutoff()) == PruneCount(runs=10, steps=10, attempts=20)
    assert store.count_prunable_runs(cutoff()) == 10
    assert store.count_prunable_runs(cutoff(), ["failed", "cancelled"]) == 6
    assert store.prune_batch(cutoff(), limit=4) == PruneCount(runs=4, steps=4, attempts=8)

    gone = old[-4:]
    left = {run.run_id for run in store.list_runs(limit=100)}
    assert left == set(old[:-4]) | set(running) | set(recent)
    for run_id in gone:
        assert store.list_step_states(run_id) == []
        assert store.get_run_history(run_id) == []
    assert store.count_prunable(cutoff()) == PruneCount(runs=6, steps=6, attempts=12)


def test_prune_runs_batches_until_nothing_is_left(store: WorkflowStore) -> None:
    add_runs(store, 7, age=2 * MONTH)
    add_runs(store, 2, age=2 * MONTH, statuses=["running"])
    seen: list[int] = []
    total = store.prune(cutoff(), batch_size=3, on_batch=lambda t: seen.append(t.runs))
    assert total == PruneCount(runs=7, steps=7, attempts=14)
    assert seen == [3, 6, 7]
    assert [run.status for run in store.list_runs()] == ["running", "running"]


def test_only_the_statuses_asked_for(store: WorkflowStore) -> None:
    add_runs(store, 6, age=2 * MONTH)  # completed, failed, cancelled twice each
    assert store.prune(cutoff(), ["failed"]) == PruneCount(runs=2, steps=2, attempts=4)
    assert sorted({run.status for run in store.list_runs()}) == ["cancelled", "completed"]


def test_unsettled_statuses_and_naive_times_are_refused(store: WorkflowStore) -> None:
    with pytest.raises(InvalidStatus, match="not a prunable run status"):
        store.prune_batch(cutoff(), ["running"])
    with pytest.raises(InvalidStatus, match="not a run status"):
        store.count_prunable(cutoff(), ["exploded"])
    with pytest.raises(ValueError, match="at least one"):
        store.prune_batch(cutoff(), [])
    with pytest.raises(ValueError, match="aware"):
        store.prune_batch(dt.datetime(2020, 1, 1))
    with pytest.raises(ValueError, match="limit"):
        store.prune_batch(cutoff(), limit=0)


def test_the_batch_query_walks_the_status_created_index(store: WorkflowStore) -> None:
    """Each status is an index range scan that stops after the batch's worth of entries."""
    add_runs(store, 30, age=2 * MONTH)
    seen: list[tuple[str, Any]] = []  # the statement and the DBAPI parameters it was sent with

    def capture(conn: object, cursor: object, statement: str, params: object, *_: object) -> None:
        if "candidates" in statement:
            seen.append((statement, params))

    sa.event.listen(store.engine, "before_cursor_execute", capture)
    try:
        store.prune_batch(cutoff(), limit=5)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", capture)
    [(statement, params)] = seen
    with store.engine.connect() as conn:
        if store.dialect == "postgresql":
            # A table this small is cheaper to scan; ask whether the index *can* serve it.
            conn.exec_driver_sql("SET enable_seqscan = off")
            plan = "\n".join(row[0] for row in conn.exec_driver_sql(f"EXPLAIN {statement}", params))
            conn.rollback()
        else:
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params).all()
            plan = "\n".join(str(row[-1]) for row in rows)
        index = index_and_partitions(conn, "idx_workflow_runs_status_created")
    # Once per status; on the partitioned layout, once per status in each day's partition.
    scans = sum(plan.count(name) for name in index if name != "idx_workflow_runs_status_created")
    if len(index) == 1:
        assert plan.count("idx_workflow_runs_status_created") == 3, plan
    else:
        assert scans >= 3 and scans % 3 == 0, plan
    assert "Seq Scan" not in plan and "SCAN workflow_runs" not in plan, plan


def test_a_run_locked_by_another_transaction_is_skipped(pg_engine: sa.Engine) -> None:
    """A run being resumed (its row locked) stays; a second prune skips the first one's rows."""
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    runs = add_runs(store, 3, age=2 * MONTH)
    with pg_engine.connect() as other:
        other.exec_driver_sql(
            "SELECT 1 FROM workflow_runs WHERE workflow_run_id = %(id)s FOR UPDATE",
            {"id": runs[0]},
        )
        assert store.prune_batch(cutoff(), limit=10).runs == 2
        other.rollback()
    assert [run.run_id for run in store.list_runs()] == [runs[0]]
