"""Real Celery workers (prefork) on real brokers, mirroring into PostgreSQL."""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowRun, WorkflowStore
from pikku_celery.store.models import SETTLED_RUN_STATUSES
from tests.conftest import service_missing

ROOT = Path(__file__).resolve().parents[2]
# The servers, elsewhere than this machine's defaults (the compose stack's `tests` service).
REDIS_URL = os.environ.get("PIKKU_TEST_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
AMQP_URL = os.environ.get("PIKKU_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def redis_db(number: int) -> str:
    """A Redis database of the suite's own: each user of Redis takes another number."""
    return f"{REDIS_URL}/{number}"


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    default = {"redis": 6379, "amqp": 5672}.get(parts.scheme, 0)
    return parts.hostname or "127.0.0.1", parts.port or default


BROKERS = {
    "redis": (redis_db(15), address(REDIS_URL)[1]),
    "rabbitmq": (AMQP_URL, address(AMQP_URL)[1]),
}
BACKEND_URL = redis_db(14)
# What the mirror logs when it could not journal an event, write a batch, or reach the
# database; a test whose database never went away sees none of them.
MIRROR_TROUBLE = (
    "could not journal",
    "could not write its journal",
    "set aside a",
    "cannot reach the workflow database",
)
QUEUE = f"shop-{uuid.uuid4().hex[:8]}"


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


@pytest.fixture(scope="session")
def shop(pg_url: str) -> ModuleType:
    """The users' app module, imported once with the session's PostgreSQL mirror."""
    os.environ.update(
        SHOP_DATABASE_URL=pg_url,
        SHOP_QUEUE=QUEUE,
        SHOP_BACKEND_URL=BACKEND_URL,
        SHOP_BROKER_URL=BROKERS["redis"][0],
    )
    host, port = address(REDIS_URL)
    if not port_open(port, host):
        service_missing("Redis", ConnectionRefusedError(f"{host}:{port}"))
    import redis

    # Start from empty broker and result databases (RabbitMQ needs nothing: the
    # queue name is this session's own). Never flushed again: a restarted
    # worker must find what a killed one left behind.
    for url in (BROKERS["redis"][0], BACKEND_URL):
        redis.Redis.from_url(url).flushdb()
    module = importlib.import_module("tests.acceptance.shop")
    with module.pikku.store.engine.begin() as conn:  # where steps count their side effects
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS shop_effects (label TEXT, pid INTEGER)")
    return module


@pytest.fixture(autouse=True)
def no_message_of_an_earlier_test(request: pytest.FixtureRequest) -> None:
    """A test that uses the shop starts with its Redis queue empty. A worker that stops
    puts back the messages it held (a retry waiting for its countdown), and the next test's
    worker would run them: a step of another test's run, against this test's database.
    Within a test nothing is emptied: a restarted worker finds what a killed one left."""
    if "shop" not in request.fixturenames:
        return
    import redis

    client = redis.Redis.from_url(BROKERS["redis"][0])
    try:
        # The queue and its priority lists; kombu's bindings stay, for a running worker.
        for key in client.scan_iter(match=f"{QUEUE}*"):
            client.delete(key)
        # And the messages a killed worker held unacknowledged for this queue: the next
        # worker to start restores them (kombu's ``unacked`` hash, shared by every queue).
        for tag, entry in client.hgetall("unacked").items():
            try:
                routing_key = json.loads(entry)[2]
            except (ValueError, IndexError, TypeError):
                continue
            if str(routing_key).startswith(QUEUE):
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)
    except redis.ConnectionError:
        return  # the shop fixture says Redis is missing, in the way the suite says it
    finally:
        client.close()
    # And the durable runs an earlier test left going: a worker that starts recovers them,
    # and their replays would run here, beside this test's tasks, in its journal.
    shop = request.getfixturevalue("shop")
    with shop.pikku.store.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE workflow_runs SET status = 'cancelled' "
            "WHERE status IN ('running', 'suspended') AND wire->>'type' = 'workflow'"
        )


@dataclass
class Worker:
    broker: str
    proc: subprocess.Popen[bytes]
    log: Path
    journal: Path
    store: WorkflowStore

    def wait_for_run(self, run_id: str, timeout: float = 45) -> WorkflowRun:
        deadline = time.monotonic() + timeout
        while True:
            try:
                run = self.store.get_run(run_id)
            except LookupError:
                run = None
            if run is not None and run.status in SETTLED_RUN_STATUSES:
                return run
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"run {run_id} is still {run and run.status} after {timeout}s; "
                    f"worker log:\n{self.log.read_text()[-4000:]}"
                )
            time.sleep(0.1)

    def wait_for_history(
        self, run_id: str, expected: list[tuple[str, int, str]], timeout: float = 20
    ) -> None:
        """Late events (a retry handler that commits after the next attempt ended) converge."""
        deadline = time.monotonic() + timeout
        while (found := history_of(self.store, run_id)) != expected:
            if time.monotonic() > deadline:
                assert found == expected
            time.sleep(0.1)

    def wait_ready(self, timeout: float = 60) -> float:
        """Until the worker says it is ready; returns the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while "ready." not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the worker did not start:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.1)
        return time.monotonic()

    def kill_all(self) -> None:
        """SIGKILL the worker and its pool children at once: a lost machine."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """A warm shutdown, as a deploy or restart does it."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)

    def journal_lines(self) -> list[str]:
        return self.journal.read_text().splitlines() if self.journal.exists() else []


def start_worker(
    shop: ModuleType,
    broker: str,
    tmp: Path,
    concurrency: int = 2,
    extra_env: dict[str, str] | None = None,
    broker_url: str | None = None,
    extra_args: tuple[str, ...] = (),
    nodename: str | None = None,
    wait_ready: bool = True,
    queues: str = QUEUE,
) -> Iterator[Worker]:
    """``broker_url``: a broker of the test's own (e.g. one it restarts) instead of ``broker``'s;
    ``extra_args``: more ``celery worker`` options (``-E`` for task events, say);
    ``nodename``: the worker's name (a restarted worker keeps its name); ``wait_ready``:
    False to yield as soon as the process runs (to start several at once); ``queues``: what
    it consumes (comma-separated)."""
    url = broker_url or BROKERS[broker][0]
    host, port = address(url)
    if not port_open(port, host):
        service_missing(broker, ConnectionRefusedError(f"{host}:{port}"))
    app = shop.app
    app.conf.broker_url = url
    # Drop pooled connections to the previous broker (Celery does the same after a fork).
    app._after_fork()
    log = tmp / f"worker-{broker}-{uuid.uuid4().hex[:6]}.log"
    journal = tmp / f"journal-{broker}.txt"
    env = {
        **os.environ,
        "SHOP_BROKER_URL": url,
        "SHOP_JOURNAL": str(journal),
        "PYTHONPATH": str(ROOT),
        **(extra_env or {}),
    }
    name = nodename or f"shop-{broker}-{uuid.uuid4().hex[:6]}@%h"
    log_file = log.open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            shop.__name__,  # the shop, or another app module of the same shape
            "worker",
            "--pool=prefork",
            f"--concurrency={concurrency}",
            "-Q",
            queues,
            "-n",
            name,
            "--without-gossip",
            "--without-mingle",
            "-l",
            "info",
            *extra_args,
        ],
        cwd=ROOT,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a test can kill it whole
    )
    try:
        deadline = time.monotonic() + 60
        while wait_ready and "ready." not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the worker did not start:\n{log.read_text()[-4000:]}")
            time.sleep(0.2)
    except BaseException:
        # Ctrl-C (or SIGTERM, see tests/conftest.py) while it starts: no teardown follows
        # a fixture that never yielded, so the worker goes here, its pool with it.
        stop_group(proc, grace=0)
        log_file.close()
        raise
    try:
        yield Worker(broker, proc, log, journal, shop.pikku.store)
    finally:
        stop_group(proc)
        log_file.close()


def stop_group(proc: subprocess.Popen[bytes], grace: float = 20) -> None:
    """A warm shutdown within ``grace`` seconds, else SIGKILL to the worker's whole process
    group (it was started in a session of its own): no pool child outlives it."""
    if grace > 0 and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is gone already
    proc.wait()


worker_running = contextmanager(start_worker)


@pytest.fixture(scope="module", params=list(BROKERS))
def worker(
    request: pytest.FixtureRequest, shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    yield from start_worker(shop, request.param, tmp_path_factory.mktemp(request.param))


def history_of(store: WorkflowStore, run_id: str) -> list[tuple[str, int, str]]:
    return [(a.step_name, a.attempt, a.status) for a in store.get_run_history(run_id)]


def children_pids(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(line) for line in out.stdout.split()]


def effects(worker: Worker, label: str) -> int:
    """How often a step really did its work, as the shop's tasks record it in the database."""
    with worker.store.engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM shop_effects WHERE label = :label"),
                {"label": label},
            ).scalar_one()
        )


def wait_until(condition: Callable[[], object], timeout: float = 30, what: str = "") -> None:
    """Rows appear within the mirror's flush lag: a run or step not there yet is waited for."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except LookupError:  # RunNotFound, StepNotFound: not written yet
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
