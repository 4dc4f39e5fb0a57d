"""Result wake-ups on the broker (``pikku_result_wakeups = "broker"``): a reader that cannot
LISTEN (through PgBouncer in transaction mode) is told on Redis when its result commits,
the batch sends no NOTIFY, and while Redis is away readers poll and still get their results.

A Redis of this module's own (``tests/support/redis_server.py``), so it can be stopped.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from celery import Celery

from pikku_celery import PikkuCelery, WorkflowStore
from tests.conftest import service_missing
from tests.integration.test_result_watch import (
    backend_store,
    counting_reads,
    pgbouncer_in_transaction_mode,
    wait_in_thread,
    write_success,
)
from tests.support.redis_server import RedisServer

PUSH_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        server.start()
    except RuntimeError as exc:
        service_missing("redis-server", exc)
    yield server
    server.stop()


@pytest.fixture
def writer(broker: RedisServer, pg_url: str, tmp_path: Path) -> Iterator[PikkuCelery]:
    """The process that commits results: it announces them on the broker."""
    app = Celery("writer", broker=broker.url, set_as_current=False)
    app.conf.pikku_result_wakeups = "broker"
    pikku = PikkuCelery(app, database_url=pg_url, journal_dir=str(tmp_path))
    yield pikku
    pikku.uninstall()
    pikku.mirror.close()
    pikku.store.close()
    app.close()


def told_reader(broker: RedisServer, database_url: str) -> Celery:
    app = Celery(
        "told reader", broker=broker.url, backend=f"pikku+{database_url}", set_as_current=False
    )
    app.conf.pikku_result_wakeups = "broker"
    return app


def until_pushes(app: Celery, pushes: bool = True) -> None:
    watch = backend_store(app).results.watch(["nothing"])
    try:
        deadline = time.monotonic() + PUSH_TIMEOUT
        while watch.pushes is not pushes:
            assert time.monotonic() < deadline, f"the watch never said pushes={pushes}"
            time.sleep(0.05)
    finally:
        watch.close()


def test_a_reader_that_cannot_listen_is_told_on_the_broker(
    broker: RedisServer, writer: PikkuCelery, pg_url: str
) -> None:
    with pgbouncer_in_transaction_mode(pg_url) as pooled:
        reader = told_reader(broker, pooled)
        try:
            until_pushes(reader)
            task_id = str(uuid.uuid4())
            reads = counting_reads(reader)
            thread, got = wait_in_thread(reader, task_id)
            time.sleep(1.5)  # polling every few (up to 50) milliseconds would read 30 times
            write_success(reader, writer.store, task_id, 7)
            thread.join(30)
            assert got == [7]
            # The first read, one when the subscription was made, the one it was told to
            # make; a second's fallback look at most.
            assert len(reads) <= 4, reads
        finally:
            backend_store(reader).close()
            reader.close()


def test_a_batch_told_on_the_broker_sends_no_notify(
    broker: RedisServer, writer: PikkuCelery, pg_url: str
) -> None:
    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as listening:
        listening.execute("LISTEN pikku_celery_results")
        reader = told_reader(broker, pg_url)
        try:
            write_success(reader, writer.store, str(uuid.uuid4()), 1)
            heard = list(listening.notifies(timeout=0.5, stop_after=1))
            assert heard == []  # no instance-wide NOTIFY lock taken for it
            plain = WorkflowStore(pg_url)
            write_success(reader, plain, str(uuid.uuid4()), 2)
            plain.close()
            assert len(list(listening.notifies(timeout=5, stop_after=1))) == 1  # the control
        finally:
            backend_store(reader).close()
            reader.close()


def test_while_the_broker_is_away_readers_poll_and_writes_still_commit(
    broker: RedisServer, writer: PikkuCelery, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    reader = told_reader(broker, pg_url)
    try:
        until_pushes(reader)
        broker.stop()
        until_pushes(reader, pushes=False)
        task_id = str(uuid.uuid4())
        with caplog.at_level(logging.WARNING, logger="pikku_celery"):
            threading.Timer(0.3, write_success, (reader, writer.store, task_id, 9)).start()
            assert reader.AsyncResult(task_id).get(timeout=10) == 9  # polled, not told
        told = [r for r in caplog.records if "could not tell waiting readers" in r.getMessage()]
        assert len(told) == 1
        broker.start()
        until_pushes(reader)
    finally:
        if not broker.running:
            broker.start()
        backend_store(reader).close()
        reader.close()
