"""Every row of a run carries its run's day: the UTC day the run was made, whichever writer
writes the row and on whatever day (revision 0016). The partitioned layout files a run's
rows under it, so a row with another day would land in another partition than its run.

Runs are made a second before midnight and most of their rows are written after it.
"""

from __future__ import annotations

import datetime as dt

from pikku_celery import WorkflowStore
from pikku_celery.store import MirrorBatch, NewStep, RunOutcome, StepTransition
from tests.support.published import lone_step

UTC = dt.timezone.utc
LATE = dt.datetime(2026, 12, 5, 23, 59, 59, tzinfo=UTC)
NEXT = LATE + dt.timedelta(seconds=10)
DAY = LATE.date()
CHILD_TABLES = (
    "workflow_step",
    "workflow_step_history",
    "pikku_celery_deliveries",
    "pikku_celery_run_events",
    "pikku_celery_chords",
)


def _follower(run_id: str, step_id: str, parent: str, at: dt.datetime) -> NewStep:
    return NewStep(
        run_id=run_id,
        step_id=step_id,
        step_name="ship",
        rpc_name="shop.ship",
        data_json="[2]",
        at=at,
        parent_step_id=parent,
    )


def _moved(step_id: str, attempt: int, status: str, at: dt.datetime) -> StepTransition:
    ended = status in ("succeeded", "failed")
    return StepTransition(
        step_id=step_id,
        attempt=attempt,
        status=status,
        at=at,
        running_at=None if ended else at,
        ended_at=at if ended else None,
        result_json='"ok"' if status == "succeeded" else None,
        error_json='{"type": "ValueError", "message": "again"}' if status == "failed" else None,
        task_id=step_id,
        delivery_ids=() if ended else (f"{step_id}-{attempt}-{status}",),
    )


def _mismatches(store: WorkflowStore) -> dict[str, int]:
    """Rows of each table without a day, or with another day than their run's."""
    found = {}
    with store.engine.connect() as conn:
        for table in CHILD_TABLES:
            found[table] = conn.exec_driver_sql(
                f"SELECT count(*) FROM {table} t LEFT JOIN workflow_runs r "
                "ON r.workflow_run_id = t.workflow_run_id "
                "WHERE t.run_day IS NULL OR r.run_day IS NULL OR t.run_day <> r.run_day"
            ).scalar_one()
    return found


def _days(store: WorkflowStore, table: str, run_id: str) -> set[dt.date]:
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            f"SELECT DISTINCT run_day FROM {table} WHERE workflow_run_id = '{run_id}'"
        ).scalars()
        return {day if isinstance(day, dt.date) else dt.date.fromisoformat(day) for day in rows}


def test_rows_written_after_midnight_carry_the_day_their_run_was_made(
    store: WorkflowStore,
) -> None:
    store.batches.apply_batch(
        MirrorBatch(
            steps=[lone_step("lone", LATE), lone_step("canvas", LATE, chord_body="body")],
            transitions=[_moved("lone", 1, "running", LATE)],
        )
    )
    store.batches.apply_batch(
        MirrorBatch(
            steps=[_follower("canvas", "link", "canvas", NEXT)],
            transitions=[
                _moved("lone", 1, "failed", NEXT),
                _moved("lone", 2, "running", NEXT),
                _moved("canvas", 1, "running", NEXT),
                _moved("canvas", 1, "succeeded", NEXT),
            ],
            outcomes=[RunOutcome("canvas", "canvas", "complete", NEXT)],
        )
    )
    store.batches.apply_batch(
        MirrorBatch(
            steps=[_follower("canvas", "body", "link", NEXT)],
            transitions=[_moved("lone", 2, "succeeded", NEXT)],
            outcomes=[RunOutcome("lone", "lone", "complete", NEXT)],
        )
    )
    assert store.get_run("lone").status == "completed"
    for table in ("workflow_runs", *CHILD_TABLES[:3]):
        assert _days(store, table, "lone") == {DAY}, table
    for table in ("workflow_runs", "workflow_step", "pikku_celery_chords"):
        assert _days(store, table, "canvas") == {DAY}, table
    assert _mismatches(store) == dict.fromkeys(CHILD_TABLES, 0)


def test_the_store_faces_writes_carry_their_runs_day(store: WorkflowStore) -> None:
    """Durable workflows' writes: a run, a claimed step, its attempts, a retry, an event."""
    assert store.workflows.start_run("checkout", {}, run_id="wf")
    assert store.claims.claim_step("wf", "wf-pay", "pay", "shop.pay", {"order": 1})
    store.attempts.record_attempt("wf-pay", 1, "running", run_id="wf")
    store.attempts.record_attempt("wf-pay", 1, "failed", error={"message": "declined"})
    store.attempts.create_retry_attempt("wf-pay", "scheduled", run_id="wf")
    store.workflows.send_event("wf", "approved", {"by": "ops"})
    plain = store.create_run("report", {})
    assert store.claims.claim_step(plain, "rep-1", "render", None, {})
    made = store.get_run("wf").created_at.astimezone(UTC).date()
    assert _days(store, "workflow_runs", "wf") == {made}
    assert _days(store, "workflow_step_history", "wf") == {made}
    assert _days(store, "pikku_celery_run_events", "wf") == {made}
    assert _mismatches(store) == {**dict.fromkeys(CHILD_TABLES, 0)}
    with store.engine.connect() as conn:
        attempts = conn.exec_driver_sql(
            "SELECT attempt, status FROM workflow_step_history "
            "WHERE workflow_step_id = 'wf-pay' ORDER BY attempt"
        ).all()
    assert [tuple(row) for row in attempts] == [(1, "failed"), (2, "scheduled")]
