"""A hosted publisher (``PIKKU_PUBLISHER_JOURNAL=node``) in a process of its own: it only
appends, and the node's flusher of its machine writes what it published, be it a real
prefork worker's main process or ``pikku-celery flusher``. Real Redis, PostgreSQL and
processes; the publisher is SIGKILLed and nothing it journaled is lost.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from pikku_celery import WorkflowStore
from tests.acceptance.conftest import (
    QUEUE,
    REDIS_URL,
    ROOT,
    Worker,
    address,
    port_open,
    redis_db,
    start_worker,
    wait_until,
)
from tests.conftest import service_missing

# The plain app's broker and results, as its own tests use them.
BROKER_URL = redis_db(13)
BACKEND_URL = redis_db(12)

APP = "tests.acceptance.plain_app:pikku"

# A web request's process: it publishes, says what it runs, then waits to be killed.
PUBLISHER = """
import json, sys, threading
from tests.acceptance.plain_app import add, pikku
queue = sys.argv[2] or None
ids = [add.apply_async((i, 1), queue=queue).id for i in range(int(sys.argv[1]))]
print(json.dumps({
    "ids": ids,
    "sink": type(pikku.mirror.sink).__name__,
    "threads": sorted(t.name for t in threading.enumerate()),
    "connections": pikku.store.engine.pool.checkedin() + pikku.store.engine.pool.checkedout(),
}), flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def plain(pg_url: str) -> ModuleType:
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
def journal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hosted-journal")


def environment(journal_dir: Path, **more: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PIKKU_JOURNAL_DIR": str(journal_dir),
        **more,
    }


class Publisher:
    """The publisher's process, once it has published (its report read)."""

    def __init__(self, journal_dir: Path, count: int, queue: str = "") -> None:
        env = environment(journal_dir, PIKKU_PUBLISHER_JOURNAL="node")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, str(count), queue],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the publisher failed (exit {self.proc.wait()})"
        self.report: dict[str, Any] = json.loads(line)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=10)  # waits, and closes its pipes


def hosted_journals(journal_dir: Path) -> list[Path]:
    return list(journal_dir.glob("*/*-hosted.journal"))


def published_with_input(store: WorkflowStore, ids: list[str], status: str) -> bool:
    steps = [store.get_step(task_id) for task_id in ids]
    # The input is the publisher's alone: a worker that records a step itself has none.
    return all(s.status == status and s.data is not None for s in steps)


@pytest.fixture(scope="module")
def worker(
    plain: ModuleType, journal_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    yield from start_worker(
        plain,
        "redis",
        tmp_path_factory.mktemp("hosted"),
        broker_url=BROKER_URL,
        extra_env={"PIKKU_JOURNAL_DIR": str(journal_dir)},
    )


def test_a_prefork_workers_node_flusher_writes_a_hosted_publishers_steps(
    worker: Worker, journal_dir: Path
) -> None:
    publisher = Publisher(journal_dir, 20)
    try:
        assert publisher.report["sink"] == "HostedSink"
        threads = publisher.report["threads"]
        assert not [name for name in threads if name.startswith("pikku-celery")], threads
        assert publisher.report["connections"] == 0  # no database connection either
        ids = publisher.report["ids"]
        # The worker ran them and its node flusher wrote the publisher's journal: each
        # step has the input only the publisher journaled, long before a worker would
        # record a step without it (60 s).
        wait_until(
            lambda: published_with_input(worker.store, ids, "succeeded"),
            timeout=30,
            what="the hosted publisher's steps, written by the worker's node",
        )
        assert len(hosted_journals(journal_dir)) == 1  # its publisher lives
    finally:
        publisher.kill()
    # Killed: its journal is written already, and goes.
    wait_until(lambda: not hosted_journals(journal_dir), timeout=20, what="the journal to go")


def test_the_flusher_command_writes_what_a_killed_hosted_publisher_left_and_stops_cleanly(
    plain: ModuleType, tmp_path: Path
) -> None:
    journal_dir = tmp_path / "journal"
    queue = f"nobody-{uuid.uuid4().hex[:8]}"  # no worker: the steps stay scheduled
    store = plain.pikku.store
    try:
        publisher = Publisher(journal_dir, 5, queue)
        publisher.kill()  # nothing wrote its journal yet
        left = publisher.report["ids"]
        assert len(hosted_journals(journal_dir)) == 1
        log = tmp_path / "flusher.log"
        with log.open("wb") as out:
            flusher = subprocess.Popen(
                [sys.executable, "-m", "pikku_celery", "flusher", "-A", APP],
                cwd=ROOT,
                env=environment(journal_dir),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: "writing the journals" in log.read_text(), what="the flusher")
            wait_until(
                lambda: published_with_input(store, left, "scheduled"),
                what="the killed publisher's steps",
            )
            publisher = Publisher(journal_dir, 5, queue)  # a live one now
            live = publisher.report["ids"]
            wait_until(
                lambda: published_with_input(store, live, "scheduled"),
                what="the live publisher's steps",
            )
            publisher.kill()
            wait_until(lambda: not hosted_journals(journal_dir), what="its journal to go")
        finally:
            flusher.send_signal(signal.SIGTERM)
            code = flusher.wait(timeout=30)
        assert code == 0, log.read_text()
        assert "stopped" in log.read_text()
    finally:
        redis.Redis.from_url(BROKER_URL).delete(queue)
