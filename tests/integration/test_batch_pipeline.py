"""A batch's statements sent together (PostgreSQL's pipeline mode) fail and race as one
statement at a time did: a dropped connection is an outage, and a publisher and a worker
writing the same lone task at the same moment both land, and a step that cannot be written
counts none of its deliveries."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.errors import StoreUnavailable
from pikku_celery.schema import mirror_deliveries
from pikku_celery.store import MirrorBatch, NewStep, RunOutcome, StepTransition
from pikku_celery.store.engine import make_engine
from pikku_celery.store.mirror_batch import BatchResult
from tests.conftest import truncate


@pytest.fixture
def one_connection(pg_url: str) -> Iterator[WorkflowStore]:
    """A store whose every batch runs on the same pooled connection."""
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    truncate(engine)
    store = WorkflowStore(engine)
    yield store
    engine.dispose()


def _published(step_id: str) -> NewStep:
    return NewStep(
        run_id=step_id,
        step_id=step_id,
        step_name="noop",
        rpc_name="app.noop",
        data_json='{"args": [], "kwargs": {}}',
        at=dt.datetime.now(dt.timezone.utc),
        run_workflow="app.noop",
        run_input_json='{"args": [], "kwargs": {}}',
        run_wire_json='{"type": "task"}',
    )


def _ran(step_id: str) -> MirrorBatch:
    """A lone task as its worker writes it: the step, its success and its run's end."""
    now = dt.datetime.now(dt.timezone.utc)
    batch = MirrorBatch(steps=[_published(step_id)])
    batch.transitions.append(
        StepTransition(
            step_id=step_id,
            attempt=1,
            status="succeeded",
            at=now,
            running_at=now,
            ended_at=now,
            result_json="null",
            task_id=step_id,
            reason="first",
            delivery_ids=(str(uuid.uuid4()),),
        )
    )
    batch.outcomes.append(RunOutcome(step_id, step_id, "complete", now))
    return batch


def test_a_connection_dropped_under_a_batch_is_an_outage_and_the_next_batch_lands(
    one_connection: WorkflowStore, pg_url: str
) -> None:
    store = one_connection
    assert store.batches.apply_batch(_ran(str(uuid.uuid4()))).missing == frozenset()
    with store.engine.connect() as pooled:  # the one connection the batches run on
        pid = pooled.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text("SELECT pg_terminate_backend(CAST(:pid AS integer))"), {"pid": pid})
    admin.dispose()
    step_id = str(uuid.uuid4())
    with pytest.raises(StoreUnavailable):
        store.batches.apply_batch(_ran(step_id))
    # The dead connection left the pool: the same batch goes through on a new one.
    assert store.batches.apply_batch(_ran(step_id)).missing == frozenset()
    assert store.get_step(step_id).status == "succeeded"
    assert store.get_run(step_id).status == "completed"


def test_a_worker_batch_racing_the_publishers_for_one_lone_task_lands_whole(
    pg_engine: sa.Engine,
) -> None:
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    step_id = str(uuid.uuid4())
    results: list[BatchResult] = []
    with store.transaction() as publisher:
        # The publisher's batch wrote the step and has not committed yet: the worker's
        # insert of the same step waits for it, then finds it written by another.
        store.batches.apply_batch(MirrorBatch(steps=[_published(step_id)]), conn=publisher)
        worker = threading.Thread(
            target=lambda: results.append(store.batches.apply_batch(_ran(step_id)))
        )
        worker.start()
        time.sleep(0.3)
        assert worker.is_alive()
    worker.join(10)
    [result] = results
    assert result.missing == frozenset()  # nothing waits for a later batch
    assert store.get_step(step_id).status == "succeeded"
    assert store.get_run(step_id).status == "completed"


def test_a_step_that_cannot_be_written_counts_none_of_its_deliveries(
    pg_engine: sa.Engine,
) -> None:
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    run_id = str(uuid.uuid4())
    # Its run holds another step of its name already: the lone task's step waits.
    other = dataclasses.replace(_published(str(uuid.uuid4())), run_id=run_id)
    assert store.batches.apply_batch(MirrorBatch(steps=[other])).missing == frozenset()
    batch = _ran(run_id)
    [delivery] = batch.transitions[0].delivery_ids
    assert store.batches.apply_batch(batch).missing == frozenset({run_id})
    # Counted with the steps' writes, and taken back: a later batch counts it.
    with pg_engine.connect() as conn:
        ledger = conn.execute(
            sa.select(mirror_deliveries.c.event_id).where(mirror_deliveries.c.event_id == delivery)
        ).all()
    assert ledger == []
