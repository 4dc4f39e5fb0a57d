"""The compose stack a user starts: up, the demo workflow through it, read back, down."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pikku_celery.testing.docker import wait_until
from tests.conftest import REQUIRE_SERVICES

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker" / "docker-compose.yml"
ALWAYS_UP = ("postgres", "redis", "worker", "beat", "flower", "dashboard")
# The stack's images: the official ones unless CI names its own (tests/conftest.py leaves only
# PIKKU_TEST_* variables to the tests, so they are passed on under the stack's names here).
IMAGES = {
    "PIKKU_IMAGE": "PIKKU_TEST_WORKER_IMAGE",
    "PIKKU_POSTGRES_IMAGE": "PIKKU_TEST_POSTGRES_IMAGE",
    "PIKKU_REDIS_IMAGE": "PIKKU_TEST_REDIS_IMAGE",
}
PUBLISH_DEMO = """
from celery import chain
from pikku_celery.demo import app as demo
print(demo.pikku.run(
    chain(demo.reserve.s(1), demo.charge.s(), demo.ship.s()), name="checkout", input={"order": 1}
))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


class Stack:
    def __init__(self, compose: str, client: Any) -> None:
        self.project = f"pikku-stack-{uuid.uuid4().hex[:8]}"
        self.compose = compose
        self.client = client
        self.dashboard = free_port()
        self.flower = free_port()
        self.env = {
            **os.environ,
            "POSTGRES_PASSWORD": uuid.uuid4().hex,
            "PIKKU_DASHBOARD_PORT": str(self.dashboard),
            "PIKKU_FLOWER_PORT": str(self.flower),
            "FLOWER_UNAUTHENTICATED_API": "true",
            **{name: os.environ[test] for name, test in IMAGES.items() if os.environ.get(test)},
        }

    def run(self, *args: str, timeout: float = 180) -> str:
        done = subprocess.run(
            [self.compose, "-p", self.project, "-f", str(COMPOSE_FILE), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"docker-compose {' '.join(args)}:\n{done.stderr[-3000:]}"
        return done.stdout

    def containers(self) -> dict[str, Any]:
        found = self.client.containers.list(
            all=True, filters={"label": f"com.docker.compose.project={self.project}"}
        )
        return {c.labels["com.docker.compose.service"]: c for c in found}

    def healthy(self) -> bool:
        containers = self.containers()
        for container in containers.values():
            container.reload()
        migrate = containers.get("migrate")
        return (
            migrate is not None
            and (migrate.attrs["State"]["Status"], migrate.attrs["State"]["ExitCode"])
            == ("exited", 0)
            and all(
                name in containers
                and containers[name].attrs["State"].get("Health", {}).get("Status") == "healthy"
                for name in ALWAYS_UP
            )
        )

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "40")


@pytest.fixture
def stack(docker_engine: Any) -> Iterator[Stack]:
    compose = shutil.which("docker-compose")
    if compose is None:
        message = "docker-compose is not installed; `apt-get install docker-compose`"
        if REQUIRE_SERVICES:
            pytest.fail(message)
        pytest.skip(message)
    up = Stack(compose, docker_engine)
    try:
        up.run("up", "-d", "--no-build")
        yield up
    finally:
        up.run("down", "-v", "--remove-orphans", timeout=120)


def test_the_compose_stack_runs_the_demo_workflow_and_shows_it_in_the_dashboard_and_flower(
    stack: Stack,
) -> None:
    try:
        wait_until(stack.healthy, 120, "every service of the stack healthy")
    except AssertionError:
        raise AssertionError(stack.logs()) from None
    worker = stack.containers()["worker"]
    code, output = worker.exec_run(["python", "-c", PUBLISH_DEMO])
    assert code == 0, output
    run_id = output.decode().split()[-1]
    dashboard = f"http://127.0.0.1:{stack.dashboard}"
    wait_until(
        lambda: get_json(f"{dashboard}/api/runs/{run_id}")["run"]["status"] == "completed",
        60,
        "the demo run completed, in the dashboard",
    )
    document = get_json(f"{dashboard}/api/runs/{run_id}")
    attempts = {
        step["step_name"]: [a["status"] for a in step["attempts"]] for step in document["steps"]
    }
    assert attempts == {
        "reserve": ["succeeded"],
        "charge": ["failed", "failed", "succeeded"],
        "ship": ["succeeded"],
    }
    listed = get_json(f"{dashboard}/api/runs")["runs"]
    assert run_id in {run["run_id"] for run in listed}
    # Flower saw the same tasks through the worker's events (-E), each ending in SUCCESS.
    task_ids = {a["task_id"] for step in document["steps"] for a in step["attempts"]}
    flower = f"http://127.0.0.1:{stack.flower}"

    def flower_saw_them() -> bool:
        tasks = get_json(f"{flower}/api/tasks")
        return all(tasks.get(task_id, {}).get("state") == "SUCCESS" for task_id in task_ids)

    wait_until(flower_saw_them, 30, "every task of the run in Flower, succeeded")
    stack.run("down", "-v")
    assert stack.containers() == {}
    volumes = stack.client.volumes.list(
        filters={"label": f"com.docker.compose.project={stack.project}"}
    )
    assert volumes == []
