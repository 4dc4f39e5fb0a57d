"""A lone task's worker records its run and step from the message, before the publisher's
journal is written: the rows are the same whichever lands first.

A lone task (a run of its own) never waits for its publisher's batch: that wait was most of
``AsyncResult.get()``'s latency. The worker knows everything the publisher records (the
input, when the message was sent, its ETA, routing and chord), so the publisher's record,
landing later, changes nothing.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.mirror import PublishedStep, Recorder
from pikku_celery.store import NewRun

ETA = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
DATA = {"args": [2, 3], "kwargs": {"note": "é"}}
ROUTING = {"exchange": "", "routing_key": "celery"}


def publish(recorder: Recorder, step_id: str, sent_at: float, chord_body: str | None) -> None:
    recorder.published(
        PublishedStep(
            run_id=step_id,
            step_id=step_id,
            step_name="add",
            rpc_name="shop.add",
            data=DATA,
            retries=2,
            retry_delay=0.5,
            eta=ETA,
            new_run=NewRun("shop.add", DATA, {"type": "task"}),
            routing=ROUTING,
            chord_body=chord_body,
            at=sent_at,
        )
    )


def work(recorder: Recorder, step_id: str, sent_at: float, chord_body: str | None) -> None:
    adoption = recorder.adoption(
        step_id,
        "add",
        "shop.add",
        published=False,
        data=DATA,
        retries=2,
        retry_delay=0.5,
        routing=ROUTING,
        sent_at=sent_at,
        eta=ETA.timestamp(),
        chord_body=chord_body,
    )
    recorder.started(step_id, 1, worker="w1", pid=7, adoption=adoption)
    recorder.succeeded(step_id, step_id, 1, 5)


# Written by the worker's own events, at the moments the two orders ran them.
_WORKER_TIMES = ("running_at", "succeeded_at")


def rows(store: WorkflowStore, run_id: str) -> dict[str, Any]:
    """Every column of the run's rows but their keys, when they were last written, and
    the moments of the worker's own events."""
    found: dict[str, Any] = {}
    with store.engine.connect() as c:
        for table, key in (
            ("workflow_runs", "workflow_run_id"),
            ("workflow_step", "workflow_run_id"),
            ("workflow_step_history", "workflow_step_id"),
        ):
            result = c.execute(sa.text(f"SELECT * FROM {table} WHERE {key} = :r"), {"r": run_id})
            found[table] = [
                {
                    k: v
                    for k, v in row._mapping.items()
                    if k not in ("history_id", "updated_at", *_WORKER_TIMES) and v != run_id
                }
                for row in result
            ]
    return found


@pytest.mark.parametrize("chord", [False, True])
def test_a_lone_tasks_rows_are_the_same_whether_its_worker_or_its_publisher_lands_first(
    store: WorkflowStore, tmp_path: Path, chord: bool
) -> None:
    publisher = Recorder(store, journal_dir=tmp_path / "publisher", background=False)
    worker = Recorder(store, journal_dir=tmp_path / "worker", background=False)

    def landed(order: str, sent_at: float) -> dict[str, Any]:
        step_id = str(uuid.uuid4())
        # A chord's body is its own: each order's header is in a chord of its own.
        body = f"body-of-{step_id}" if chord else None
        sides: list[tuple[Recorder, Callable[..., None]]] = [
            (publisher, publish),
            (worker, work),
        ]
        for recorder, record in sides if order == "publisher first" else sides[::-1]:
            record(recorder, step_id, sent_at, body)
            assert recorder.flush()
        assert publisher.journal_depth == worker.journal_depth == 0, order
        return rows(store, step_id)

    try:
        sent_at = time.time()
        first = landed("publisher first", sent_at)
        assert landed("worker first", sent_at) == first
        # A chord's header holds its run open until the body is out.
        assert first["workflow_runs"][0]["status"] == ("running" if chord else "completed")
    finally:
        publisher.close()
        worker.close()


def test_a_lone_tasks_worker_events_are_written_without_its_publishers_batch(
    store: WorkflowStore, tmp_path: Path
) -> None:
    worker = Recorder(store, journal_dir=tmp_path, background=False)
    try:
        step_id = str(uuid.uuid4())
        work(worker, step_id, time.time(), None)
        assert worker.flush()
        assert worker.journal_depth == 0  # nothing waits for the publisher
        assert store.get_run(step_id).status == "completed"
    finally:
        worker.close()
