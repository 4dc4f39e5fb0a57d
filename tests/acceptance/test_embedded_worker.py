"""Celery's own embedded test worker (``celery.contrib.testing.worker.start_worker``), mirrored.

Test suites built on it (Celery's, pytest-celery's) stop the worker between
tests and give it a few seconds to exit. A mirrored worker must stop as fast
as a plain one, whatever its journal still holds: events that wait for another
process (a step whose publish is not in SQL yet) stay in the journal for the
next process to adopt, unwaited.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.integration import headers as h
from pikku_celery.mirror import journal_depth
from tests.acceptance.conftest import REDIS_URL, address, port_open, redis_db
from tests.conftest import service_missing

BROKER_URL = redis_db(11)


@pytest.fixture(autouse=True)
def _redis() -> None:
    host, port = address(REDIS_URL)
    if not port_open(port, host):
        service_missing("Redis", ConnectionRefusedError(f"{host}:{port}"))


def _app(name: str) -> Celery:
    app = Celery(name, broker=BROKER_URL, backend=BROKER_URL, set_as_current=False)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        task_default_queue=f"{name}-{uuid.uuid4().hex[:8]}",
        worker_hijack_root_logger=False,
        # Results kept for good: redis-py warns on the SETEX that expiring ones take.
        result_expires=None,
    )

    @app.task(name=f"{name}.add")
    def add(x: int, y: int) -> int:
        return x + y

    return app


def _seconds_to_stop(app: Celery, mirror: PikkuCelery | None = None) -> tuple[float, object]:
    """Runs one task on an embedded worker; how long the worker and its process's mirror
    took to stop after it (a prefork child closes its mirror as it exits, and the process
    that ran an embedded worker closes it at exit)."""
    add = app.tasks[f"{app.main}.add"]
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        # Its publisher is another process's mirror (the header names a run), so the
        # worker's start of it waits for that publisher's step, which never comes here.
        result = add.apply_async((2, 3), headers={h.RUN_ID: f"elsewhere-{uuid.uuid4().hex}"})
        value = result.get(timeout=20)
        began = time.monotonic()
    if mirror is not None:
        mirror.mirror.close()
    return time.monotonic() - began, value


@pytest.fixture
def mirrored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PikkuCelery]:
    monkeypatch.setenv("PIKKU_JOURNAL_DIR", str(tmp_path / "journal"))
    url = f"sqlite:///{tmp_path / 'mirror.db'}"
    store = WorkflowStore(url)
    store.init()
    store.close()
    app = _app("embedded_mirrored")
    pikku = PikkuCelery(app, database_url=url, mirror="all")
    yield pikku
    # This app must not mirror later tests' tasks (it has every shared task) into a
    # database that is gone with the test.
    pikku.uninstall()


def test_a_mirrored_embedded_worker_stops_as_fast_as_a_plain_one(
    mirrored: PikkuCelery,
) -> None:
    plain_stop, plain_value = _seconds_to_stop(_app("embedded_plain"))
    stop, value = _seconds_to_stop(mirrored.app, mirrored)
    assert value == plain_value == 5
    assert stop < plain_stop + 1.0, (stop, plain_stop)
    # Nothing was lost on the way out: what waits stays in the journal for adoption.
    folder = mirrored.mirror.journal_folder
    assert journal_depth(folder.parent, only=folder.name) >= 1
