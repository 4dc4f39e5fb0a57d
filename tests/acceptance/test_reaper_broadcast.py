"""The reaper asks only workers with pikku-celery what they hold.

Every worker on a broker hears its broadcasts, whatever its app: a worker of an app
without pikku-celery has no ``pikku_held`` command and would log "No such control
command" with a traceback on every reaper pass. Here such a worker shares the Redis
broker with a pikku worker, and the reaper's questions leave nothing in its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from celery import Celery

from pikku_celery.integration import control
from tests.acceptance.conftest import BROKERS, Worker, worker_running

FOREIGN_APP = """
from celery import Celery

app = Celery("foreign")
app.conf.update(broker_connection_retry_on_startup=True)


@app.task(name="foreign.ping")
def ping():
    return "pong"
"""


@pytest.fixture
def foreign(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A worker of an app without pikku-celery on the shop's broker: its name and its log."""
    (tmp_path / "foreign_app.py").write_text(FOREIGN_APP, encoding="utf-8")
    name = f"foreign-{uuid.uuid4().hex[:6]}@{os.uname().nodename}"
    log = tmp_path / "foreign.log"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "CELERY_BROKER_URL": BROKERS["redis"][0]}
    command = [sys.executable, "-m", "celery", "-A", "foreign_app", "worker", "-l", "info"]
    command += ["-n", name, "-Q", f"foreign-{uuid.uuid4().hex[:6]}", "--pool=solo"]
    command += ["--without-gossip", "--without-mingle"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: torn down whole
        )
    try:
        deadline = time.monotonic() + 60
        while "ready." not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield name, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def pikku_worker(shop: ModuleType, tmp_path: Path) -> Iterator[Worker]:
    with worker_running(shop, "redis", tmp_path, concurrency=1) as worker:
        yield worker


def test_a_worker_without_pikku_is_never_asked_what_it_holds(
    shop: ModuleType, pikku_worker: Worker, foreign: tuple[str, Path]
) -> None:
    foreign_name, foreign_log = foreign
    app: Celery = shop.app
    for _ in range(3):  # three reaper passes' questions
        view = control.ask(app, [str(uuid.uuid4())], timeout=1.0)
        # Both are alive in the reaper's view; only the pikku worker says when it started.
        assert foreign_name in view.workers and view.workers[foreign_name] is None
        pikku_names = [n for n, since in view.workers.items() if since is not None]
        assert any(n.startswith("shop-redis") for n in pikku_names), view.workers
    # The foreign worker reads its mailbox in order: once it answers this ping, every
    # broadcast sent before it has been handled (and logged, had it failed).
    deadline = time.monotonic() + 20
    while not app.control.ping(destination=[foreign_name], timeout=1.0):
        assert time.monotonic() < deadline, foreign_log.read_text()
    logged = foreign_log.read_text()
    assert "No such control command" not in logged, logged
    assert "pikku_held" not in logged, logged
