"""The Procfile under honcho, as CI runs it: the worker, beat, Flower and the dashboard on the local
PostgreSQL and Redis serve a real run, then stop on one signal and leave no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tests.acceptance.conftest import REDIS_URL, address, port_open, redis_db
from tests.conftest import PgServer, service_missing
from tests.deploy.conftest import BIN, ROOT, tool
from tests.support.http import free_port, get_json

# A Redis database of this test's own (the acceptance suites use 12 to 15).
BROKER = redis_db(11)
PUBLISH = """
from celery import chain
from pikku_celery.demo import app as d
print(d.pikku.run(chain(d.reserve.s(1), d.charge.s(), d.ship.s()), name="checkout", input={}))
"""


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]
    dashboard: str
    flower: str

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 45) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            with suppress(OSError, urllib.error.URLError, ValueError, KeyError):
                if found := check():
                    return found
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {what}; honcho said:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.2)

    def process_groups(self) -> dict[str, int]:
        """Each Procfile process's group, from honcho's "started (pid=N)" lines."""
        started = re.findall(r"(\w+)\.1 started \(pid=(\d+)\)", self.log.read_text())
        return {name: int(pid) for name, pid in started}


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def marked_processes(marker: str) -> list[int]:
    """Every process on this machine whose environment carries the test's marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
    return found


@contextmanager
def honcho_running(database_url: str, tmp: Path, marker: str) -> Iterator[Stack]:
    dashboard_port, flower_port = free_port(), free_port()
    no_dotenv = tmp / "empty.env"  # a developer's ./.env must not override the test's settings
    no_dotenv.write_text("")
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PIKKU_DATABASE_URL": database_url,
        "PIKKU_DEMO_BROKER_URL": BROKER,
        "PIKKU_CELERY_APP": "pikku_celery.demo.app:pikku",
        "PIKKU_DASHBOARD_HOST": "127.0.0.1",
        "PIKKU_DASHBOARD_PORT": str(dashboard_port),
        "PIKKU_FLOWER_URL": f"http://127.0.0.1:{flower_port}",
        "FLOWER_ADDRESS": "127.0.0.1",
        "FLOWER_PORT": str(flower_port),
        "FLOWER_UNAUTHENTICATED_API": "true",  # this test reads Flower's API
        "PIKKU_HONCHO_TEST": marker,
        "PIKKU_REAP_EVERY": "1",  # beat sends the reaper every second, not every minute
    }
    log = tmp / "honcho.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [tool("honcho"), "start", "-f", str(ROOT / "Procfile"), "-e", str(no_dotenv)],
            cwd=tmp,  # the demo app keeps nothing in the current folder on Redis, but be sure
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        stack = Stack(
            proc,
            log,
            env,
            f"http://127.0.0.1:{dashboard_port}",
            f"http://127.0.0.1:{flower_port}",
        )
        try:
            yield stack
        finally:
            if proc.poll() is None:  # the test failed before stopping it: leave nothing
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            for pgid in stack.process_groups().values():
                with suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)


def test_the_procfile_serves_a_run_to_the_dashboard_and_flower_then_stops_cleanly(
    pg_server: PgServer, tmp_path: Path
) -> None:
    host, port = address(REDIS_URL)
    if not port_open(port, host):
        service_missing("Redis", ConnectionRefusedError(f"{host}:{port}"))
    database_url = pg_server.create_database("pikku_honcho")
    broker = redis.Redis.from_url(BROKER)
    broker.flushdb()
    marker = uuid.uuid4().hex
    env_base = {**os.environ, "PIKKU_DATABASE_URL": database_url}
    upgrade = subprocess.run(
        [tool("pikku-celery"), "db", "upgrade"], env=env_base, capture_output=True, timeout=60
    )
    assert upgrade.returncode == 0, upgrade.stderr  # once per deploy, before the processes
    try:
        with honcho_running(database_url, tmp_path, marker) as stack:
            runs = f"{stack.dashboard}/api/runs"
            stack.wait_for("dashboard", lambda: get_json(runs)["total"] == 0)
            stack.wait_for("worker", lambda: "ready." in stack.log.read_text())
            # Flower has seen the worker's events: it will see the run's tasks too.
            workers = f"{stack.flower}/api/workers?status=true"
            stack.wait_for("Flower seeing the worker", lambda: any(get_json(workers).values()))

            published = subprocess.run(
                [sys.executable, "-c", PUBLISH],
                env=stack.env,
                capture_output=True,
                text=True,
                timeout=60,
                cwd=tmp_path,
            )
            assert published.returncode == 0, published.stderr
            run_id = published.stdout.strip()

            def completed() -> bool:
                return bool(get_json(f"{runs}/{run_id}")["run"]["status"] == "completed")

            stack.wait_for("the run to complete", completed)
            assert run_id in [run["run_id"] for run in get_json(runs)["runs"]]
            steps = get_json(f"{runs}/{run_id}")["steps"]
            attempts = {s["step_id"]: len(s["attempts"]) for s in steps}
            assert [s["step_name"] for s in steps] == ["reserve", "charge", "ship"]
            assert list(attempts.values()) == [1, 3, 1]  # the demo's charge fails twice

            def flower_saw_every_step() -> dict[str, Any]:
                tasks = get_json(f"{stack.flower}/api/tasks")
                # Its success event, not state SUCCESS: a late retry event leaves that at RETRY.
                seen = all(tasks.get(task_id, {}).get("succeeded") for task_id in attempts)
                return tasks if seen else {}

            tasks = stack.wait_for("Flower to show the run's tasks", flower_saw_every_step)
            for task_id, count in attempts.items():
                assert tasks[task_id]["retries"] == count - 1

            # Beat sends the reaper and the worker runs it: nothing is stuck, so it says so.
            stack.wait_for(
                "the worker to run the reaper beat sent",
                lambda: re.search(r"pikku_celery\.reap\[[^\]]+\] succeeded", stack.log.read_text()),
            )
            groups = stack.process_groups()
            assert set(groups) == {"worker", "beat", "flower", "dashboard"}
            assert len(marked_processes(marker)) > len(groups)  # honcho, shells, pool children

            # One signal to honcho stops everything it started.
            stack.proc.send_signal(signal.SIGTERM)
            stack.proc.wait(timeout=30)
            log = stack.log.read_text()
            for name in groups:
                assert re.search(rf"{name}\.1 stopped \(rc=", log), log[-3000:]
            assert [name for name, pgid in groups.items() if group_alive(pgid)] == []
            assert marked_processes(marker) == []
    finally:
        broker.flushdb()
        broker.close()
