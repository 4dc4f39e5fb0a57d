"""The stuck-attempt reaper against real prefork workers whose processes get SIGKILLed.

Celery sends no signal when a pool process or a whole worker is killed, so
without the reaper each of these attempts would stay ``running`` for ever.
Each test starts its own worker: the broker's queue must be theirs alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pikku_celery.integration.reaper import ReapReport
from pikku_celery.store import LOST_ERROR_TYPE
from tests.acceptance.conftest import ROOT, Worker, history_of, wait_until, worker_running


def _kill_child_running(worker: Worker, name: str) -> int:
    """SIGKILL the pool process that runs the first attempt of task ``name``."""
    wait_until(
        lambda: any(line.startswith(f"{name} start") for line in worker.journal_lines()),
        what=f"{name} to start",
    )
    line = next(line for line in worker.journal_lines() if line.startswith(f"{name} start"))
    child = int(line.split()[2])
    os.kill(child, signal.SIGKILL)
    return child


def _killed_whole_while_running(shop: ModuleType, tmp: Path, task: Any) -> Any:
    """Publish ``task``; SIGKILL its whole worker once the mirror says it runs."""
    with worker_running(shop, "redis", tmp) as worker:
        result = task.delay(30)
        wait_until(
            lambda: (
                worker.store.get_step_state(result.id, task.name.split(".")[-1]).status == "running"
            ),
            what=f"{task.name} running",
        )
        worker.kill_all()  # no signal of any kind leaves a SIGKILLed worker
    return result


def _wait_running(worker: Worker, result: Any, step: str) -> None:
    wait_until(
        lambda: worker.store.get_step_state(result.id, step).status == "running",
        what=f"{step} running",
    )


def _starts(worker: Worker, name: str) -> int:
    return sum(line.startswith(f"{name} start") for line in worker.journal_lines())


def test_a_pool_process_killed_without_acks_late_fails_its_step_at_once(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Celery itself reports a dead pool process (task_failure with WorkerLostError)
    # when it will not run the message again: the run ends, nothing waits for the reaper.
    with worker_running(shop, "redis", tmp_path_factory.mktemp("child")) as worker:
        result = shop.lose_for_good.delay(30)
        child = _kill_child_running(worker, "lose_for_good")
        run = worker.wait_for_run(result.id, timeout=30)
        assert run.status == "failed"
        assert run.error is not None and run.error["type"].endswith("WorkerLostError")
        assert f"signal {signal.SIGKILL.value}" in run.error["message"] or "SIGKILL" in str(
            run.error["message"]
        ), (child, run.error)
        assert history_of(worker.store, result.id) == [("lose_for_good", 1, "failed")]
        assert shop.pikku.reap(idle_for=0).lost == []


def test_a_task_acked_on_receipt_and_lost_with_its_whole_worker_is_retried_once(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("lose-once")
    result = _killed_whole_while_running(shop, tmp, shop.lose_once)
    time.sleep(0.5)
    assert shop.pikku.store.get_step_state(result.id, "lose_once").status == "running"

    # Two reapers at once, as on two machines: one moves the attempt and republishes it.
    reports: list[ReapReport] = []
    reapers = [
        threading.Thread(
            target=lambda: reports.append(shop.pikku.reap(idle_for=0, reply_timeout=1))
        )
        for _ in range(2)
    ]
    for reaper in reapers:
        reaper.start()
    for reaper in reapers:
        reaper.join()
    assert sum(len(r.lost) for r in reports) == 1, [r.as_dict() for r in reports]
    assert sum(len(r.retried) for r in reports) == 1
    assert shop.pikku.store.get_step_state(result.id, "lose_once").status == "scheduled"

    with worker_running(shop, "redis", tmp) as second:
        run = second.wait_for_run(result.id)
        assert (run.status, run.output) == ("completed", "lose_once done")
        second.wait_for_history(
            result.id, [("lose_once", 1, "lost"), ("lose_once", 2, "succeeded")]
        )
        lost, retry = second.store.get_run_history(result.id)
        assert lost.error is not None and lost.error["type"] == LOST_ERROR_TYPE
        assert lost.error["worker"] == lost.worker and lost.error["redelivery_expected"] is False
        assert "does not answer" in lost.error["message"]
        assert (retry.reason, retry.delivery_count) == ("lost", 1)
        # Given up before the retry was added: the lost attempt ended, then the next began.
        assert lost.failed_at is not None and retry.created_at is not None
        assert lost.failed_at < retry.created_at
        assert _starts(second, "lose_once") == 2  # the killed one and the retry, nothing more


def test_a_lost_attempt_with_no_retries_left_fails_its_step_and_run(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("lose-for-good")
    result = _killed_whole_while_running(shop, tmp, shop.lose_for_good)
    with worker_running(shop, "redis", tmp) as second:
        # The periodic task, run by a worker as celery beat sends it.
        shop.app.send_task("pikku_celery.reap", kwargs={"idle_for": 0, "reply_timeout": 1})
        run = second.wait_for_run(result.id, timeout=30)
        assert run.status == "failed"
        assert run.error is not None and run.error["type"] == LOST_ERROR_TYPE
        assert "No retries are left" in run.error["message"]
        assert history_of(second.store, result.id) == [("lose_for_good", 1, "lost")]
        assert second.store.get_step_state(result.id, "lose_for_good").status == "failed"
        assert _starts(second, "lose_for_good") == 1


def test_the_reaper_leaves_attempts_of_live_workers_alone(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with worker_running(shop, "redis", tmp_path_factory.mktemp("alive")) as worker:
        result = shop.slow.delay(4)
        _wait_running(worker, result, "slow")
        report = shop.pikku.reap(idle_for=0)
        assert report.checked >= 1 and not report.lost and not report.failed
        assert worker.store.get_step_state(result.id, "slow").status == "running"
        assert worker.wait_for_run(result.id).status == "completed"


def test_a_whole_worker_killed_mid_step_is_lost_then_redelivered_to_the_next_worker(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("whole-worker")
    fast = {"SHOP_VISIBILITY_TIMEOUT": "3"}
    with worker_running(shop, "redis", tmp, extra_env=fast) as first:
        # acks_late: the broker keeps the message until it ends (shorter than the 3 s
        # visibility timeout, or Redis would hand it out again while it runs).
        result = shop.slow.delay(2)
        _wait_running(first, result, "slow")
        first.kill_all()
    report = shop.pikku.reap(idle_for=0, reply_timeout=1)
    assert [a.step_id for a in report.lost] == [result.id]
    assert [a.step_id for a in report.awaiting_redelivery] == [result.id]
    step = first.store.get_step_state(result.id, "slow")
    assert step.status == "lost" and step.error is not None
    assert "does not answer" in step.error["message"]
    assert first.store.get_run(result.id).status == "running"  # it will go on: not failed

    with worker_running(shop, "redis", tmp, extra_env=fast) as second:
        run = second.wait_for_run(result.id, timeout=60)
        assert (run.status, run.output) == ("completed", "slow done")
        [attempt] = second.store.get_run_history(result.id)
        assert (attempt.attempt, attempt.status, attempt.delivery_count) == (1, "succeeded", 2)
        assert attempt.error is None
        assert shop.pikku.reap(idle_for=0).lost == []


def test_reap_command_reports_steps_nobody_picks_up(shop: ModuleType, tmp_path: Path) -> None:
    result = shop.parked.delay()  # routed to a queue no worker consumes
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pikku_celery",
            "--app",
            "tests.acceptance.shop:pikku",
            "reap",
            "--stale-after",
            "0s",
            "--json",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert result.id in [s["step_id"] for s in report["stale_scheduled"]]
    assert report["lost"] == [] and report["failed"] == []


def test_an_attempt_over_its_deadline_is_terminated_and_its_step_failed(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with worker_running(shop, "redis", tmp_path_factory.mktemp("deadline")) as worker:
        result = shop.slow.delay(30)
        _wait_running(worker, result, "slow")
        time.sleep(1.2)
        report = shop.pikku.reap(idle_for=0, deadline=1)
        assert [a.step_id for a in report.failed] == [result.id]
        assert report.retried == []  # its task id is revoked: a republish would be dropped
        run = worker.wait_for_run(result.id)
        assert run.status == "failed"
        assert run.error is not None and "deadline" in run.error["message"]
        assert "It is not retried" in run.error["message"]
        wait_until(
            lambda: f"Terminating {result.id}" in worker.log.read_text(),
            what="the worker to terminate the task",
        )
        time.sleep(1)
        assert not any(line == "slow end" for line in worker.journal_lines())
