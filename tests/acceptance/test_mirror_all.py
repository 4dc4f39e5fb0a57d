"""mirror="all" on an app of plain Celery tasks: real prefork workers, Redis, PostgreSQL.

The app (``plain_app``) has no pikku decorator anywhere; its tasks are
mirrored as a ``WorkflowTask`` would be, and the excluded ones leave no row.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Iterator
from types import ModuleType

import pytest
import sqlalchemy as sa
from celery import chain, chord

from pikku_celery.errors import RunNotFound
from tests.acceptance.conftest import (
    QUEUE,
    REDIS_URL,
    Worker,
    address,
    history_of,
    port_open,
    redis_db,
    start_worker,
)
from tests.conftest import service_missing

# Beside the shop's 14 and 15. Never flushed: the queue is this session's own and result
# keys are task ids, so whatever else uses these databases is left as it is.
BROKER_URL = redis_db(13)
BACKEND_URL = redis_db(12)


@pytest.fixture(scope="module")
def plain(pg_url: str) -> ModuleType:
    """The users' existing app, imported once with the session's PostgreSQL mirror."""
    host, port = address(REDIS_URL)
    if not port_open(port, host):
        service_missing("Redis", ConnectionRefusedError(f"{host}:{port}"))
    os.environ.update(
        PLAIN_DATABASE_URL=pg_url,
        PLAIN_QUEUE=QUEUE,
        PLAIN_BROKER_URL=BROKER_URL,
        PLAIN_BACKEND_URL=BACKEND_URL,
    )
    return importlib.import_module("tests.acceptance.plain_app")


@pytest.fixture(scope="module")
def worker(plain: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    yield from start_worker(plain, "redis", tmp_path_factory.mktemp("plain"), broker_url=BROKER_URL)


def rows_for(worker: Worker, task_id: str, task_name: str) -> int:
    """Every row, in any table, that names this task id or task name."""
    with worker.store.engine.connect() as conn:
        return sum(
            int(conn.execute(sa.text(sql), {"id": task_id, "name": task_name}).scalar_one())
            for sql in (
                "SELECT count(*) FROM workflow_runs WHERE workflow_run_id = :id"
                " OR workflow = :name",
                "SELECT count(*) FROM workflow_step WHERE workflow_step_id = :id"
                " OR rpc_name = :name",
                "SELECT count(*) FROM workflow_step_history WHERE workflow_step_id = :id",
            )
        )


def test_a_plain_task_is_a_run_of_its_own(plain: ModuleType, worker: Worker) -> None:
    result = plain.add.delay(2, 3)
    assert result.get(timeout=30) == 5  # the task itself is as it was
    run = worker.wait_for_run(result.id)
    assert (run.workflow, run.status, run.output, run.wire) == (
        "plain.add",
        "completed",
        5,
        {"type": "task"},
    )
    [attempt] = worker.store.get_run_history(result.id)
    assert (attempt.step_name, attempt.attempt, attempt.status) == ("add", 1, "succeeded")
    assert attempt.task_id == result.id
    assert attempt.worker is not None and attempt.worker.startswith("shop-redis-")
    assert attempt.pid is not None and attempt.pid != worker.proc.pid
    assert attempt.scheduled_at and attempt.running_at and attempt.succeeded_at
    step = worker.store.get_step_state(result.id, "add")
    assert (step.rpc_name, step.data) == ("plain.add", {"args": [2, 3], "kwargs": {}})


def test_a_chain_of_plain_tasks_is_one_run_of_linked_steps(
    plain: ModuleType, worker: Worker
) -> None:
    run_id = plain.pikku.run(
        chain(plain.add.s(1, 2), plain.double.s(), plain.add.s(10)),
        name="sums",
        input={"start": 1},
    )
    run = worker.wait_for_run(run_id)
    assert (run.workflow, run.status, run.output, run.input) == (
        "sums",
        "completed",
        16,
        {"start": 1},
    )
    worker.wait_for_history(
        run_id, [("add", 1, "succeeded"), ("double", 1, "succeeded"), ("add#2", 1, "succeeded")]
    )
    steps = {s.step_name: s for s in worker.store.list_step_states(run_id)}
    assert steps["add"].from_step_name is None
    assert steps["double"].from_step_name == "add"
    assert steps["add#2"].from_step_name == "double"
    assert [steps[name].result for name in ("add", "double", "add#2")] == [3, 6, 16]


def test_a_chain_of_plain_tasks_sent_on_its_own_outputs_its_last_links_result(
    plain: ModuleType, worker: Worker
) -> None:
    result = (plain.add.s(1, 2) | plain.double.s()).delay()
    assert result.get(timeout=30) == 6
    run = worker.wait_for_run(result.id)
    assert (run.workflow, run.status, run.output) == ("plain.add", "completed", 6)
    steps = {s.step_name: s.result for s in worker.store.list_step_states(result.id)}
    assert steps == {"add": 3, "double": 6}


def test_a_chord_of_plain_tasks_is_one_run(plain: ModuleType, worker: Worker) -> None:
    run_id = plain.pikku.run(
        chord([plain.add.s(1, 1), plain.add.s(2, 2)], plain.total.s()), name="totals"
    )
    run = worker.wait_for_run(run_id)
    assert (run.status, run.output) == ("completed", 6)
    steps = {s.step_name: s for s in worker.store.list_step_states(run_id)}
    assert set(steps) == {"add", "add#2", "total"}
    assert steps["total"].from_step_name in {"add", "add#2"}


def test_self_retry_of_a_plain_task_is_three_attempts(plain: ModuleType, worker: Worker) -> None:
    result = plain.flaky.delay(2)
    assert result.get(timeout=30) == "done after 2 retries"
    assert worker.wait_for_run(result.id).status == "completed"
    worker.wait_for_history(
        result.id, [("flaky", 1, "failed"), ("flaky", 2, "failed"), ("flaky", 3, "succeeded")]
    )
    history = worker.store.get_run_history(result.id)
    for attempt in history[:2]:
        assert attempt.error is not None
        assert attempt.error["type"] == "ConnectionError"
        assert attempt.error["message"] == "the gateway is busy"
    assert [a.reason for a in history] == ["first", "retry", "retry"]
    assert all(a.task_id == result.id for a in history)
    state = worker.store.get_step_state(result.id, "flaky")
    assert (state.status, state.attempt_count) == ("succeeded", 3)


def test_a_bare_self_retry_records_celerys_retry_as_the_reason(
    plain: ModuleType, worker: Worker
) -> None:
    result = plain.bare_retry.delay(2)
    assert result.get(timeout=30) == 2
    worker.wait_for_history(
        result.id,
        [("bare_retry", 1, "failed"), ("bare_retry", 2, "failed"), ("bare_retry", 3, "succeeded")],
    )
    for attempt in worker.store.get_run_history(result.id)[:2]:
        assert attempt.error is not None
        assert attempt.error["type"].endswith("Retry")
        assert "Retry in 0s" in attempt.error["message"]


def test_autoretry_of_a_plain_task_is_attempts_then_a_failed_run(
    plain: ModuleType, worker: Worker
) -> None:
    result = plain.refund.delay(9)
    run = worker.wait_for_run(result.id)
    assert run.status == "failed"
    assert run.error is not None and "order 9 cannot be refunded" in run.error["message"]
    worker.wait_for_history(
        result.id, [("refund", 1, "failed"), ("refund", 2, "failed"), ("refund", 3, "failed")]
    )


def test_each_step_records_the_retries_it_really_gets_as_pikku_counts_them(
    plain: ModuleType, worker: Worker
) -> None:
    """Pikku lists a step failed once its attempts reach ``retries + 1``."""
    once = plain.add.delay(1, 2)  # no autoretry, no self.retry: no retries at all
    refund = plain.refund.delay(3)  # autoretry_for, max_retries=2, default_retry_delay=0
    flaky = plain.flaky.delay(2)  # self.retry(countdown=0) twice, max_retries=5
    for result in (once, refund, flaky):
        worker.wait_for_run(result.id)
    worker.wait_for_history(
        refund.id, [("refund", 1, "failed"), ("refund", 2, "failed"), ("refund", 3, "failed")]
    )
    worker.wait_for_history(
        flaky.id, [("flaky", 1, "failed"), ("flaky", 2, "failed"), ("flaky", 3, "succeeded")]
    )
    step = worker.store.get_step_state(once.id, "add")
    assert (step.retries, step.retry_delay) == (0, None)
    step = worker.store.get_step_state(refund.id, "refund")
    # Given up after its third attempt: no retries remain, so Pikku counts it failed.
    assert (step.status, step.attempt_count, step.retries) == ("failed", 3, 2)
    assert step.attempt_count >= (step.retries or 0) + 1
    step = worker.store.get_step_state(flaky.id, "flaky")
    # Its own self.retry() told what it gets: Celery's max_retries, and the countdown.
    assert (step.status, step.retries, step.retry_delay_seconds) == ("succeeded", 5, 0.0)


def test_a_shared_task_is_mirrored(plain: ModuleType, worker: Worker) -> None:
    # The app's own instance of it: a user's `greet.delay` resolves to the current app's,
    # and the test session may hold other apps.
    result = plain.app.tasks["plain.shared_greet"].delay("ada")
    assert result.get(timeout=30) == "hello ada"
    run = worker.wait_for_run(result.id)
    assert (run.workflow, run.status, run.output) == (
        "plain.shared_greet",
        "completed",
        "hello ada",
    )
    assert history_of(worker.store, result.id) == [("shared_greet", 1, "succeeded")]


def test_an_excluded_task_leaves_no_row(plain: ModuleType, worker: Worker) -> None:
    excluded = plain.noisy_ping.delay()
    assert excluded.get(timeout=30) == "pong"
    # A mirrored task sent after it, done and in SQL: the worker's events for the
    # excluded one would have been flushed by now too (one flush interval is 40 ms).
    after = plain.add.delay(1)
    after.get(timeout=30)
    worker.wait_for_run(after.id)
    time.sleep(0.5)
    with pytest.raises(RunNotFound):
        worker.store.get_run(excluded.id)
    assert rows_for(worker, excluded.id, "plain.noisy_ping") == 0


def test_celery_plumbing_leaves_no_row(plain: ModuleType, worker: Worker) -> None:
    with worker.store.engine.connect() as conn:
        plumbing = conn.execute(
            sa.text(
                "SELECT count(*) FROM workflow_step"
                " WHERE rpc_name LIKE 'celery.%' OR rpc_name LIKE 'pikku\\_celery.%'"
            )
        ).scalar_one()
    assert plumbing == 0
