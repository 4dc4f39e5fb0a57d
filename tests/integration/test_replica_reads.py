"""The faces read on a streaming replica; writes and the result listener stay on the primary.

A real pair, made for this module (``tests/support/replica_pair.py``): a primary and a
replica streaming from it. Lag is made by pausing the replica's replay
(``pg_wal_replay_pause()``): what the primary commits then reaches the replica but is not
shown there until replay resumes.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import uvicorn
from celery import Celery
from celery.result import AsyncResult
from starlette.testclient import TestClient

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.cli import main
from pikku_celery.dashboard import create_app
from pikku_celery.errors import RunNotFound, RunNotOnReplicaYet
from pikku_celery.store import MirrorBatch, ResultWrite, now
from tests.conftest import service_missing
from tests.support.replica_pair import PairUnavailable, ReplicaPair

DATABASE = "pikku"
PASSWORD = "replica-pass"
CAUGHT_UP_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicaPair]:
    made = ReplicaPair()
    try:
        made.start()
    except PairUnavailable as exc:
        service_missing("a PostgreSQL primary and streaming replica", exc)
    try:
        admin = sa.create_engine(made.primary_url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{DATABASE}"')
        admin.dispose()
        schema = WorkflowStore(made.primary_url(DATABASE))
        schema.init()
        schema.close()
        replayed(made)
        yield made
    finally:
        made.stop()


@pytest.fixture
def primary_url(pair: ReplicaPair) -> str:
    return pair.primary_url(DATABASE)


@pytest.fixture
def replica_url(pair: ReplicaPair) -> str:
    return pair.replica_url(DATABASE)


@pytest.fixture
def store(primary_url: str, replica_url: str) -> Iterator[WorkflowStore]:
    """The faces' store: reads on the replica, writes on the primary."""
    both = WorkflowStore(primary_url, read_url=replica_url)
    yield both
    both.close()


def _scalar(url: str, statement: str) -> Any:
    engine = sa.create_engine(url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql(statement).scalar()
    finally:
        engine.dispose()


def _wait_for_replica(pair: ReplicaPair, position: str) -> None:
    """Until the replica's ``position`` (a function giving a WAL position) passes what the
    primary has written."""
    target = _scalar(pair.primary_url(), "SELECT pg_current_wal_lsn()")
    deadline = time.monotonic() + CAUGHT_UP_TIMEOUT
    while not _scalar(pair.replica_url(), f"SELECT {position}() >= '{target}'::pg_lsn"):
        if time.monotonic() > deadline:
            raise AssertionError(f"the replica's {position} did not reach {target}")
        time.sleep(0.05)


def replayed(pair: ReplicaPair) -> None:
    """Until the replica shows everything the primary committed so far."""
    _wait_for_replica(pair, "pg_last_wal_replay_lsn")


def received(pair: ReplicaPair) -> None:
    """Until the replica has received (not necessarily replayed) all the primary wrote."""
    _wait_for_replica(pair, "pg_last_wal_receive_lsn")


@contextmanager
def replay_paused(pair: ReplicaPair) -> Iterator[None]:
    """The replica keeps receiving the primary's WAL but shows none of it: lag."""
    replica = pair.replica_url()
    _scalar(replica, "SELECT pg_wal_replay_pause()")
    deadline = time.monotonic() + CAUGHT_UP_TIMEOUT
    while _scalar(replica, "SELECT pg_get_wal_replay_pause_state()") != "paused":
        assert time.monotonic() < deadline, "the replica's replay did not pause"
        time.sleep(0.02)
    try:
        yield
    finally:
        _scalar(replica, "SELECT pg_wal_replay_resume()")


def test_the_read_store_reads_on_the_replica_and_writes_on_the_primary(
    pair: ReplicaPair, store: WorkflowStore
) -> None:
    assert store.replica is not None
    with store.replica.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar() is True
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar() is False
    run_id = store.create_run("replica-writes", {"n": 1})  # refused by a replica
    store.update_run_state(run_id, "seen", True)
    replayed(pair)
    assert store.get_run(run_id).state == {"seen": True}
    lag = store.replica_lag()
    assert lag is not None and lag.caught_up
    assert store.delete_run(run_id)
    replayed(pair)
    with pytest.raises(RunNotFound) as missing:
        store.get_run(run_id)
    assert type(missing.value) is RunNotFound  # caught up: plainly not there
    primary_only = WorkflowStore(pair.primary_url(DATABASE))
    assert primary_only.replica_lag() is None
    primary_only.close()


def test_a_run_the_lagging_replica_has_not_replayed_is_not_there_yet_and_then_appears(
    pair: ReplicaPair, store: WorkflowStore
) -> None:
    before = store.count_runs(workflow="replica-lag")
    with replay_paused(pair):
        run_id = store.create_run("replica-lag", {"n": 2})
        received(pair)
        with pytest.raises(RunNotOnReplicaYet) as behind:
            store.get_run(run_id)
        message = str(behind.value)
        assert run_id in message and "behind the primary" in message
        assert "replay is paused" in message and "Try again in a moment" in message
        assert isinstance(behind.value, RunNotFound)  # a lookup that falls back still does
        assert store.count_runs(workflow="replica-lag") == before
        lag = store.replica_lag()
        assert lag is not None and not lag.caught_up and lag.paused
    replayed(pair)
    assert store.get_run(run_id).workflow == "replica-lag"
    assert store.count_runs(workflow="replica-lag") == before + 1


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_reads_on_the_replica_and_writes_on_the_primary(
    pair: ReplicaPair,
    primary_url: str,
    replica_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    primary = WorkflowStore(primary_url)
    old = primary.create_run("replica-cli", {"n": 3})
    replayed(pair)
    urls = ("--database-url", primary_url, "--read-database-url", replica_url)
    with replay_paused(pair):
        new = primary.create_run("replica-cli", {"n": 4})
        received(pair)
        code, out, _ = _cli(capsys, *urls, "runs", "list", "--workflow", "replica-cli", "--json")
        assert code == 0
        assert [run["run_id"] for run in json.loads(out)["runs"]] == [old]
        code, _, err = _cli(capsys, *urls, "runs", "show", new)
        assert code == 1
        assert "is not on the read replica" in err and "Try again in a moment" in err
        assert "Traceback" not in err
        # A write: the primary's, while the replica that was named shows none of it.
        code, out, _ = _cli(capsys, *urls, "runs", "delete", old)
        assert code == 0 and f"Deleted run {old}" in out
        with pytest.raises(RunNotFound):
            primary.get_run(old)
    replayed(pair)
    # The variable names the replica as the option does.
    monkeypatch.setenv("PIKKU_READ_DATABASE_URL", replica_url)
    code, out, _ = _cli(
        capsys,
        "--database-url",
        primary_url,
        "runs",
        "list",
        "--workflow",
        "replica-cli",
        "--json",
    )
    assert code == 0
    assert [run["run_id"] for run in json.loads(out)["runs"]] == [new]
    code, out, _ = _cli(capsys, "--database-url", primary_url, "runs", "show", new, "--json")
    assert code == 0 and json.loads(out)["run"]["run_id"] == new
    primary.close()


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no action form"
    return match.group(1)


def _running(metrics: str) -> int:
    match = re.search(r'^pikku_runs\{status="running"\} (\d+)$', metrics, flags=re.MULTILINE)
    assert match, metrics
    return int(match.group(1))


@pytest.fixture
def pikku(primary_url: str, replica_url: str, tmp_path: Path) -> Iterator[PikkuCelery]:
    """A user's app that names the replica in its settings, its results in the store."""
    app = Celery("replica-app", broker="memory://", set_as_current=False)
    app.conf.pikku_read_database_url = replica_url
    made = PikkuCelery(
        app, database_url=primary_url, journal_dir=str(tmp_path), result_backend=True
    )
    yield made
    made.uninstall()
    made.mirror.close()
    made.read_store.close()
    made.store.close()
    app.close()


def test_the_dashboard_and_metrics_read_the_replica_and_its_actions_write_the_primary(
    pair: ReplicaPair, pikku: PikkuCelery
) -> None:
    reads = pikku.read_store
    assert reads.replica is not None and pikku.store.replica is None
    primary = pikku.store
    kept = primary.create_run("replica-dashboard", {"n": 5})
    gone = primary.create_run("replica-dashboard", {"n": 6})
    replayed(pair)
    app = create_app(reads, actions=pikku, auth_token=PASSWORD)
    with TestClient(app) as client:
        signed_in = ("anyone", PASSWORD)
        page = client.get(f"/runs/{gone}", auth=signed_in)
        assert page.status_code == 200
        token = _csrf(page.text)
        running = _running(client.get("/metrics").text)
        with replay_paused(pair):
            new = primary.create_run("replica-dashboard", {"n": 7})
            received(pair)
            missing = client.get(f"/runs/{new}", auth=signed_in)
            assert missing.status_code == 404
            assert "is not on the read replica" in missing.text
            api = client.get(f"/api/runs/{new}", auth=signed_in)
            assert api.status_code == 404 and "Try again in a moment" in api.json()["error"]
            assert _running(client.get("/metrics").text) == running  # what the replica shows
            listing = client.get("/?workflow=replica-dashboard", auth=signed_in).text
            assert new not in listing and "Read on a replica that is" in listing
            assert "behind the primary" in listing
            assert client.get("/readyz").status_code == 200
            # Actions are writes: they reach the primary while the replica shows none of it.
            deleted = client.post(
                f"/runs/{gone}/delete",
                data={"csrf_token": token},
                auth=signed_in,
                follow_redirects=False,
            )
            assert deleted.status_code == 303
            token = _csrf(client.get(f"/runs/{kept}", auth=signed_in).text)
            cancelled = client.post(
                f"/runs/{kept}/cancel",
                data={"csrf_token": token},
                auth=signed_in,
                follow_redirects=False,
            )
            assert cancelled.status_code == 303, cancelled.text
            assert primary.get_run(kept).status == "cancelled"
            with pytest.raises(RunNotFound):
                primary.get_run(gone)
            # The replica, behind, still shows the run as it was: a stale read, not an error.
            assert client.get(f"/runs/{gone}", auth=signed_in).status_code == 200
        replayed(pair)
        assert client.get(f"/runs/{new}", auth=signed_in).status_code == 200
        assert client.get(f"/runs/{gone}", auth=signed_in).status_code == 404
        assert client.get(f"/api/runs/{kept}", auth=signed_in).json()["run"]["status"] == (
            "cancelled"
        )
        # One run more, one deleted, one cancelled.
        assert _running(client.get("/metrics").text) == running - 1


def test_the_result_backend_and_its_listener_never_read_the_replica(
    pair: ReplicaPair, pikku: PikkuCelery
) -> None:
    backend: Any = pikku.app.backend
    assert backend.store.replica is None
    assert backend.store.engine.url.port == pair.primary_port
    task_id = str(uuid.uuid4())
    meta: dict[str, Any] = {
        "status": "SUCCESS",
        "result": {"answer": 42},
        "traceback": None,
        "children": [],
        "date_done": dt.datetime.now(dt.timezone.utc).isoformat(),
        "task_id": task_id,
    }
    encoded = backend.encode(meta)
    payload = encoded.encode() if isinstance(encoded, str) else encoded

    def write_later() -> None:
        time.sleep(0.3)
        pikku.store.batches.apply_batch(
            MirrorBatch(results=[ResultWrite(task_id, 1, "SUCCESS", payload, now())])
        )

    with replay_paused(pair):
        writer = threading.Thread(target=write_later)
        writer.start()
        # Woken by the primary's NOTIFY and read there: the paused replica never has it.
        assert AsyncResult(task_id, app=pikku.app).get(timeout=10) == {"answer": 42}
        writer.join()


def test_the_dashboard_command_serves_reads_from_the_replica_it_is_given(
    pair: ReplicaPair,
    primary_url: str,
    replica_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pikku-celery dashboard --read-database-url``: the app it serves, asked while it is
    served (the command closes its store after)."""
    run_id = ""
    statuses: list[int] = []

    def serve(server: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        app: Any = server.config.app  # the Starlette app the command made
        with TestClient(app) as client:
            page = client.get(f"/runs/{run_id}")
            statuses.append(page.status_code)
            assert page.status_code == 200 or "is not on the read replica" in page.text

    monkeypatch.setattr(uvicorn.Server, "run", serve)
    command = (
        "--database-url",
        primary_url,
        "--read-database-url",
        replica_url,
        "dashboard",
        "--port",
        "0",
    )
    primary = WorkflowStore(primary_url)
    with replay_paused(pair):
        run_id = primary.create_run("replica-command", {"n": 8})
        received(pair)
        code, out, _ = _cli(capsys, *command)
        assert code == 0
        assert (
            f"reading the replica postgresql+psycopg://postgres@127.0.0.1:{pair.replica_port}/"
            in out
        )
    replayed(pair)
    assert _cli(capsys, *command)[0] == 0
    assert statuses == [404, 200]
    primary.close()
