"""A reader waiting in ``AsyncResult.get()`` is told when its result is committed (LISTEN
on PostgreSQL, ``PRAGMA data_version`` on SQLite) instead of reading SQL every few
milliseconds; when the LISTEN connection is cut, it still gets its result.

The reader is a Celery app with ``backend="pikku+URL"`` and no worker; the result is
written as the mirror writes it, in a batch.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from pikku_celery import WorkflowStore
from pikku_celery.store import MirrorBatch, ResultWrite, now
from pikku_celery.store.result_watch import PAYLOAD_LIMIT, listen_for_results, notify_payload
from tests.conftest import truncate


@pytest.fixture
def reader(store: WorkflowStore) -> Iterator[Celery]:
    url = store.engine.url.render_as_string(hide_password=False)
    app = Celery("reader", backend=f"pikku+{url}", set_as_current=False)
    yield app
    backend_store(app).close()
    app.close()


def backend_store(app: Celery) -> WorkflowStore:
    backend: Any = app.backend
    store: WorkflowStore = backend.store
    return store


def write_success(app: Celery, store: WorkflowStore, task_id: str, value: Any) -> None:
    meta = {
        "status": "SUCCESS",
        "result": value,
        "traceback": None,
        "children": [],
        "date_done": dt.datetime.now(dt.timezone.utc).isoformat(),
        "task_id": task_id,
    }
    encoded = app.backend.encode(meta)
    payload = encoded.encode() if isinstance(encoded, str) else encoded
    row = ResultWrite(task_id, 1, "SUCCESS", payload, now())
    store.batches.apply_batch(MirrorBatch(results=[row]))


def counting_reads(app: Celery) -> list[str]:
    """Every read of a result the reader makes, by task id (one backend serves every
    thread of the process: the waiting thread's reads are counted here)."""
    results = backend_store(app).results
    reads: list[str] = []
    original = results.get

    def get(task_id: str, **kwargs: Any) -> Any:
        reads.append(task_id)
        return original(task_id, **kwargs)

    results.get = get  # type: ignore[method-assign]
    return reads


def wait_in_thread(app: Celery, task_id: str) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(app.AsyncResult(task_id).get(timeout=30)))
    thread.start()
    return thread, got


def listener_up(store: WorkflowStore) -> None:
    """Until this process's LISTEN connection to the store's database hears (PostgreSQL):
    while it connects, as when it is cut, waiting readers poll."""
    if store.dialect != "postgresql":
        return
    watch = listen_for_results(store.engine, [])
    try:
        deadline = time.monotonic() + 30
        while not watch.pushes:
            assert time.monotonic() < deadline, "the result listener never heard its probe"
            time.sleep(0.05)
    finally:
        watch.close()


def test_a_waiting_reader_reads_when_told_not_every_few_milliseconds(
    reader: Celery, store: WorkflowStore
) -> None:
    listener_up(store)  # the first in its process starts it; a loaded machine takes a while
    task_id = str(uuid.uuid4())
    reads = counting_reads(reader)
    thread, got = wait_in_thread(reader, task_id)
    time.sleep(1.5)  # polling every few (up to 50) milliseconds would read 30 times by now
    write_success(reader, store, task_id, 7)
    thread.join(30)
    assert got == [7]
    assert reads and set(reads) == {task_id}
    # The first read, one when the listener connected (PostgreSQL), and the one it was
    # told to make; a second's fallback look at most.
    assert len(reads) <= 4, reads


def test_the_pushed_wait_can_be_turned_off(reader: Celery, store: WorkflowStore) -> None:
    reader.conf.pikku_result_notify = False
    task_id = str(uuid.uuid4())
    reads = counting_reads(reader)
    thread, got = wait_in_thread(reader, task_id)
    time.sleep(1.0)
    write_success(reader, store, task_id, 8)
    thread.join(30)
    assert got == [8]
    assert len(reads) > 10  # it polls, as before


def test_a_reader_whose_listen_connection_is_cut_still_gets_its_result(
    pg_engine: sa.Engine,
) -> None:
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    url = pg_engine.url.render_as_string(hide_password=False)
    reader = Celery("reader", backend=f"pikku+{url}", set_as_current=False)
    try:
        cut_the_listener_and_wait(reader, store)
    finally:
        backend_store(reader).close()
        reader.close()


def cut_the_listener_and_wait(reader: Celery, store: WorkflowStore) -> None:
    first = str(uuid.uuid4())
    thread, got = wait_in_thread(reader, first)
    write_success(reader, store, first, 1)
    thread.join(30)
    assert got == [1]  # the listener is up

    second = str(uuid.uuid4())
    thread, got = wait_in_thread(reader, second)
    with store.engine.connect() as conn:
        cut = conn.execute(
            sa.text(
                # This session's database only: another test session's listener is not ours
                # to cut (its readers would poll while it reconnects).
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE query = 'LISTEN pikku_celery_results' AND datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    assert cut >= 1
    write_success(reader, store, second, 2)  # while it reconnects: nobody is told
    thread.join(30)
    assert got == [2]


def test_a_notification_that_would_not_fit_says_read_them_all() -> None:
    few = [str(uuid.uuid4()) for _ in range(3)]
    assert set(notify_payload(few).split(",")) == set(few)
    many = [str(uuid.uuid4()) for _ in range(PAYLOAD_LIMIT // 36 + 1)]
    assert notify_payload(many) == "*"


@contextmanager
def pgbouncer_in_transaction_mode(pg_url: str) -> Iterator[str]:
    """A PgBouncer between the reader and PostgreSQL, pooling by transaction; its URL."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(binary):
        pytest.fail("PgBouncer is not installed: apt-get install pgbouncer (.ci/run does)")
    target = sa.make_url(pg_url)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    folder.chmod(0o755)  # PgBouncer will not run as root: it reads this as postgres
    config = folder / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"* = host={target.host} port={target.port or 5432} user={target.username}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\n"
    )
    config.chmod(0o644)
    user = ["-u", "postgres"] if os.geteuid() == 0 else []
    log = folder / "pgbouncer.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, *user, str(config)], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"PgBouncer did not start: {proc.stderr and proc.stderr.read()!r}"
                )
            time.sleep(0.05)
        yield target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def test_through_pgbouncer_in_transaction_mode_readers_poll_and_still_get_their_result(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pgbouncer_in_transaction_mode(pg_url) as pooled:
        app = Celery("pooled reader", backend=f"pikku+{pooled}", set_as_current=False)
        writer = WorkflowStore(pg_url)
        try:
            with caplog.at_level(logging.WARNING, logger="pikku_celery"):
                watch = backend_store(app).results.watch(["nothing"])
                # The listener proves it hears before it says it pushes: here it never does.
                time.sleep(3.0)
                assert not watch.pushes
                watch.close()
                task_id = str(uuid.uuid4())
                threading.Timer(0.3, write_success, (app, writer, task_id, 7)).start()
                assert app.AsyncResult(task_id).get(timeout=10) == 7  # polled, not told
            deaf = [r for r in caplog.records if "hears no notification" in r.getMessage()]
            assert len(deaf) == 1 and "pikku_result_notify" in deaf[0].getMessage()
        finally:
            backend_store(app).close()
            writer.close()
            app.close()


def test_a_direct_connection_hears_its_own_probe_and_pushes(pg_url: str) -> None:
    store = WorkflowStore(pg_url)
    watch = store.results.watch(["nothing"])
    try:
        deadline = time.monotonic() + 5
        while not watch.pushes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.pushes
    finally:
        watch.close()
        store.close()
