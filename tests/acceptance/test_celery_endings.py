"""Celery's own ways for a task to end, on a real worker: a rejected message (with and
without requeue), a hard time limit, a soft time limit the task catches, and a pool
process that dies with its events still in its journal.

Celery says some of these from the worker's main process, without the task's
request context; the mirror still records them on the right attempt.
"""

from __future__ import annotations

import time
from types import ModuleType

import pytest

from tests.acceptance.conftest import Worker, history_of, wait_until, worker_running


def test_a_message_rejected_without_requeue_fails_its_attempt_as_dead_lettered(
    shop: ModuleType, worker: Worker
) -> None:
    result = shop.dead_letter.delay(7)
    run = worker.wait_for_run(result.id)
    assert run.status == "failed"
    # The end comes from the worker's main process, the start from its pool child's
    # journal: either may commit first, and the attempt converges on both.
    wait_until(
        lambda: worker.store.get_run_history(result.id)[0].delivery_count == 1,
        timeout=10,
        what="the pool child's start of the rejected attempt",
    )
    [attempt] = worker.store.get_run_history(result.id)
    assert (attempt.attempt, attempt.status, attempt.delivery_count) == (1, "failed", 1)
    assert attempt.error is not None
    assert attempt.error["type"].endswith("Reject")
    assert (
        "dead-letters" in attempt.error["message"] and "no such order" in attempt.error["message"]
    )
    assert worker.store.get_step_state(result.id, "dead_letter").status == "failed"
    assert [line for line in worker.journal_lines() if line == "dead_letter 7"] == ["dead_letter 7"]


def test_a_message_rejected_with_requeue_is_a_redelivery_of_the_same_attempt(
    shop: ModuleType, worker: Worker
) -> None:
    order = int(time.time() * 1000) % 1_000_000
    result = shop.requeue_once.delay(order)
    run = worker.wait_for_run(result.id)
    assert (run.status, run.output) == ("completed", "second delivery")
    [attempt] = worker.store.get_run_history(result.id)
    assert (attempt.attempt, attempt.status, attempt.delivery_count) == (1, "succeeded", 2)


def test_a_hard_time_limit_fails_the_attempt_with_time_limit_exceeded(
    shop: ModuleType, worker: Worker
) -> None:
    result = shop.overrun.delay(5)
    run = worker.wait_for_run(result.id, timeout=30)
    assert run.status == "failed"
    [attempt] = worker.store.get_run_history(result.id)
    assert (attempt.status, attempt.delivery_count) == ("failed", 1)
    assert attempt.running_at is not None and attempt.failed_at is not None
    assert attempt.error is not None and attempt.error["type"].endswith("TimeLimitExceeded")
    assert history_of(worker.store, result.id) == [("overrun", 1, "failed")]


def test_a_soft_time_limit_the_task_catches_is_a_success(shop: ModuleType, worker: Worker) -> None:
    result = shop.overrun_softly.delay(5)
    run = worker.wait_for_run(result.id, timeout=30)
    assert (run.status, run.output) == ("completed", "cleaned up")
    assert history_of(worker.store, result.id) == [("overrun_softly", 1, "succeeded")]


def test_a_pool_process_killed_before_its_journal_is_flushed_loses_nothing(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("killed-child")
    # Five seconds between flushes: the start of the attempt is only in the dead
    # child's journal when it dies, so only adopting that journal can bring it to SQL.
    env = {"SHOP_FLUSH_INTERVAL": "5", "PIKKU_JOURNAL_DIR": str(tmp / "journal")}
    with worker_running(shop, "redis", tmp, extra_env=env) as worker:
        result = shop.die_after_start.delay("once")
        started = time.monotonic()
        wait_until(
            lambda: (
                [a.status for a in worker.store.get_run_history(result.id)] == ["failed"]
                and worker.store.get_run_history(result.id)[0].running_at is not None
            ),
            timeout=30,
            what=f"the killed attempt's start and end; log:\n{worker.log.read_text()[-3000:]}\n"
            f"{worker.store.get_run_history(result.id)}",
        )
        took = time.monotonic() - started
        # The adopter logs what it wrote just after its COMMIT: wait for that line too.
        wait_until(lambda: "left in" in worker.log.read_text(), timeout=10, what="the log")
        log = worker.log.read_text()
    [attempt] = worker.store.get_run_history(result.id)
    assert attempt.delivery_count == 1  # its start, once
    assert attempt.error is not None and "WorkerLostError" in attempt.error["type"]
    assert worker.store.get_run(result.id).status == "failed"
    assert "left in" in log  # a live process of the worker wrote the dead one's journal
    assert len([line for line in worker.journal_lines() if "die_after_start" in line]) == 1
    assert not list((tmp / "journal").glob("*/*.journal"))
    print(f"\nthe dead pool process's journal was written {took:.1f}s after the task started")
