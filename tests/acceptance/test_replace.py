"""Celery's ``Task.replace`` on real prefork workers: a replaced body never runs again.

The replacement takes over the replaced task's id (a group becomes a chord
whose ``celery.accumulate`` body carries it; a chain's last link carries it),
so the step of the replaced task ends with its replacement. The workers'
reapers run every half second here: a replaced step they took for lost would
be published again within a pass or two, and its body would run again.
"""

from __future__ import annotations

import importlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis
from celery import chain

from tests.acceptance.conftest import (
    REDIS_URL,
    Worker,
    address,
    history_of,
    port_open,
    redis_db,
    start_worker,
    worker_running,
)
from tests.conftest import service_missing

BROKER_URL = redis_db(13)
BACKEND_URL = redis_db(12)
# Several reaper passes: each would have published a replaced step again.
REAPER_PASSES = 4.0


@pytest.fixture(scope="module")
def plain(pg_url: str) -> ModuleType:
    host, port = address(REDIS_URL)
    if not port_open(port, host):
        service_missing("Redis", ConnectionRefusedError(f"{host}:{port}"))
    from tests.acceptance.conftest import QUEUE

    os.environ.update(
        PLAIN_DATABASE_URL=pg_url,
        PLAIN_QUEUE=QUEUE,
        PLAIN_BROKER_URL=BROKER_URL,
        PLAIN_BACKEND_URL=BACKEND_URL,
    )
    return importlib.import_module("tests.acceptance.plain_app")


@pytest.fixture(scope="module")
def worker(plain: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    yield from start_worker(
        plain,
        "redis",
        tmp_path_factory.mktemp("replace"),
        concurrency=1,
        broker_url=BROKER_URL,
        extra_env={"PIKKU_REAPER_INTERVAL": "0.5"},
    )


def runs_of_body(key: str) -> int:
    return int(redis.Redis.from_url(BACKEND_URL).get(key) or 0)


def settle_and_check(worker: Worker, run_id: str, key: str) -> None:
    """The body ran once, and stays run once while the reapers pass over the run."""
    time.sleep(REAPER_PASSES)
    assert runs_of_body(key) == 1
    assert worker.store.get_run(run_id).status == "completed"
    for step in worker.store.list_step_states(run_id):
        assert step.status == "succeeded", (step.step_name, step.status, step.error)
    assert "was lost" not in worker.log.read_text()


def test_a_task_replaced_by_a_group_runs_once_and_ends_with_its_group(
    plain: ModuleType, worker: Worker
) -> None:
    key = f"replace-{uuid.uuid4().hex}"
    result = plain.add_to_all.delay([1, 2, 3], 10, key)
    assert result.get(timeout=30) == [11, 12, 13]
    run = worker.wait_for_run(result.id, timeout=10)
    assert (run.status, run.output) == ("completed", [11, 12, 13])
    step = worker.store.get_step_state(result.id, "add_to_all")
    assert (step.status, step.result, step.attempt_count) == ("succeeded", [11, 12, 13], 1)
    names = sorted(name for name, _, _ in history_of(worker.store, result.id))
    assert names == ["add", "add#2", "add#3", "add_to_all"]
    [attempt] = [a for a in worker.store.get_run_history(result.id) if a.step_id == result.id]
    assert attempt.replaced_by == "celery.accumulate"
    assert attempt.delivery_count == 1  # the replacement carries the delivery on
    settle_and_check(worker, result.id, key)


def test_a_replaced_link_of_a_chain_hands_its_result_to_the_next_link(
    plain: ModuleType, worker: Worker
) -> None:
    key = f"replace-{uuid.uuid4().hex}"
    run_id = plain.pikku.run(
        chain(plain.add_to_all.s([1, 2], 1, key), plain.total.s()), name="replaced-in-a-chain"
    )
    run = worker.wait_for_run(run_id, timeout=30)
    assert (run.status, run.output) == ("completed", 5)
    steps = {s.step_name: s for s in worker.store.list_step_states(run_id)}
    assert set(steps) == {"add_to_all", "add", "add#2", "total"}
    # The next link follows the replaced step, whose outcome is its replacement's.
    assert steps["total"].from_step_name == "add_to_all"
    assert steps["add_to_all"].result == [2, 3]
    settle_and_check(worker, run_id, key)


def test_a_task_replaced_by_one_task_is_visible_at_once_and_ends_with_it(
    plain: ModuleType, worker: Worker
) -> None:
    key = f"replace-{uuid.uuid4().hex}"
    started = time.monotonic()
    result = plain.replace_with_one.delay(4, key)
    assert result.get(timeout=30) == 5
    run = worker.wait_for_run(result.id, timeout=10)
    # Within the flush lag, not the 60 s an event waits for a step that never comes.
    assert time.monotonic() - started < 10
    assert (run.status, run.output) == ("completed", 5)
    [step] = worker.store.list_step_states(result.id)
    assert (step.step_name, step.status, step.result) == ("replace_with_one", "succeeded", 5)
    [attempt] = worker.store.get_run_history(result.id)
    assert attempt.replaced_by == "plain.add"
    assert attempt.delivery_count == 1
    settle_and_check(worker, result.id, key)


def test_a_task_replaced_by_a_chain_ends_with_its_last_link(
    plain: ModuleType, worker: Worker
) -> None:
    key = f"replace-{uuid.uuid4().hex}"
    result = plain.replace_with_chain.delay(4, key)
    assert result.get(timeout=30) == 10
    run = worker.wait_for_run(result.id, timeout=10)
    assert (run.status, run.output) == ("completed", 10)
    steps = {s.step_name: s for s in worker.store.list_step_states(result.id)}
    assert set(steps) == {"replace_with_chain", "add"}
    assert steps["replace_with_chain"].result == 10
    assert steps["add"].from_step_name == "replace_with_chain"
    settle_and_check(worker, result.id, key)


def test_a_task_that_raises_ignore_ends_and_is_never_sent_again(
    plain: ModuleType, worker: Worker
) -> None:
    key = f"ignore-{uuid.uuid4().hex}"
    result = plain.ignored.delay(key)
    run = worker.wait_for_run(result.id, timeout=15)
    assert run.status == "cancelled"
    [attempt] = worker.store.get_run_history(result.id)
    assert attempt.status == "cancelled"
    assert attempt.error is not None and attempt.error["type"] == "celery.exceptions.Ignore"
    time.sleep(REAPER_PASSES)
    assert runs_of_body(key) == 1
    assert len(worker.store.get_run_history(result.id)) == 1


def test_a_workflow_task_replaced_by_a_group_runs_once_under_the_default_selection(
    shop: ModuleType, tmp_path: Path
) -> None:
    """``mirror="steps"``: the group's members are steps, its ``celery.accumulate`` is not."""
    with worker_running(
        shop, "redis", tmp_path, concurrency=1, extra_env={"SHOP_REAPER_INTERVAL": "0.5"}
    ) as worker:
        result = shop.add_to_all.delay([5, 6], 1)
        assert result.get(timeout=30) == [6, 7]
        run = worker.wait_for_run(result.id, timeout=10)
        assert (run.status, run.output) == ("completed", [6, 7])
        time.sleep(REAPER_PASSES)
        assert worker.journal_lines().count("add_to_all [5, 6]") == 1
        steps = {s.step_name: s for s in worker.store.list_step_states(result.id)}
        assert {name: s.status for name, s in steps.items()} == {
            "add_to_all": "succeeded",
            "add": "succeeded",
            "add#2": "succeeded",
        }
        assert worker.store.get_run(result.id).status == "completed"
        assert "was lost" not in worker.log.read_text()
