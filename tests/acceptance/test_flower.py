"""Flower alongside: a real Flower and a real worker on one broker, and the mirror agrees.

Flower keeps live tasks in memory from the workers' events; pikku-celery keeps
the history in SQL. For the same run, every task Flower shows is a step of the
run (the step id is the Celery task id), and Flower's retry count is our
attempt count minus one. This module starts its own worker, so it has no
module-wide one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import chain

from tests.acceptance.conftest import BROKERS, ROOT, worker_running
from tests.support.http import free_port, get_json


def wait_for(what: str, check: Callable[[], Any], timeout: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except (OSError, urllib.error.URLError, ValueError):
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; log:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@contextmanager
def flower_running(tmp: Path) -> Iterator[str]:
    """Flower for the shop app on its broker; its API open without auth in this test only."""
    port = free_port()
    log = tmp / "flower.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SHOP_BROKER_URL": BROKERS["redis"][0],
        "FLOWER_UNAUTHENTICATED_API": "true",
    }
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.acceptance.shop",
                "flower",
                "--address=127.0.0.1",
                f"--port={port}",
            ],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(
                "Flower",
                lambda: proc.poll() is None and get_json(f"{url}/api/tasks") == {},
                30,
                log,
            )
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_flower_shows_the_steps_and_retries_the_mirror_recorded(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("flower")
    # Flower first: it only knows the events sent while it listens. Task events are the
    # user's choice, turned on as Flower's documentation says: `celery worker -E`.
    with (
        flower_running(tmp) as flower,
        worker_running(shop, "redis", tmp, extra_args=("-E",)) as worker,
    ):
        tasks_url = f"{flower}/api/tasks"
        # One task through first: events flow from the worker to Flower.
        warm = shop.add.delay(1, 2).id
        wait_for("Flower to see a task", lambda: warm in get_json(tasks_url), 30, worker.log)

        run_id = shop.pikku.run(
            chain(shop.reserve.s(1), shop.charge.s(fail_times=1), shop.ship.s()),
            name="flower-alongside",
        )
        assert worker.wait_for_run(run_id).status == "completed"
        steps = worker.store.list_step_states(run_id)
        assert [s.step_name for s in steps] == ["reserve", "charge", "ship"]
        history = worker.store.get_run_history(run_id)
        attempts = {s.step_id: [a for a in history if a.step_id == s.step_id] for s in steps}

        def all_succeeded() -> dict[str, Any]:
            shown = get_json(tasks_url)
            ours = {task_id: shown[task_id] for task_id in attempts if task_id in shown}
            done = len(ours) == len(attempts) and all(t["succeeded"] for t in ours.values())
            return ours if done else {}

        # Wait for each task's success event, not for state SUCCESS: with countdown=0 the
        # retry event of attempt 1 can reach Flower after attempt 2 succeeded, and Celery's
        # event state then leaves the task at RETRY for good. The mirror's attempt
        # statuses only move forward, so it says succeeded.
        shown = wait_for("Flower to see the run's tasks succeed", all_succeeded, 30, worker.log)
        assert {shown[s.step_id]["state"] for s in steps} <= {"SUCCESS", "RETRY"}
        assert [s.status for s in steps] == ["succeeded"] * 3
        for step in steps:
            task = shown[step.step_id]
            assert task["name"] == step.rpc_name
            assert task["retries"] == len(attempts[step.step_id]) - 1, step.step_name
        assert [len(attempts[s.step_id]) for s in steps] == [1, 2, 1]

        # Every task of the run Flower shows is a step of ours: nothing extra, nothing unknown.
        # Of the run: under its chain's root. A task of an earlier test that this worker ran
        # (a message its worker left on the broker) is another run's, and is named if shown.
        tasks = get_json(tasks_url)
        roots = {tasks[s.step_id]["root_id"] for s in steps}
        assert roots == {steps[0].step_id}, roots
        shown_ids = {task_id for task_id, task in tasks.items() if task.get("root_id") in roots}
        others = {
            task_id: (task.get("name"), task.get("root_id"))
            for task_id, task in tasks.items()
            if task_id not in shown_ids and task_id != warm
        }
        assert shown_ids == {s.step_id for s in steps}, others
