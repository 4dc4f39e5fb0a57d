"""A database outage: events wait in the spool, in order, and are all written when it is back.

The outage is a network cut: the mirror talks to PostgreSQL through a proxy
the test owns and cuts (the shared server is never stopped).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.integration.mirror import CeleryMirror, PublishedStep
from pikku_celery.store.attempt_writes import NewRun
from pikku_celery.store.spool import Spool, orphaned_spools, spool_depth
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.postgres

ERROR = {"type": "ValueError", "message": "try again", "traceback": None}


@pytest.fixture
def proxy(pg_url: str) -> Iterator[TcpProxy]:
    url = sa.make_url(pg_url)
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as running:
        yield running


@pytest.fixture
def proxied_store(pg_url: str, proxy: TcpProxy) -> Iterator[WorkflowStore]:
    url = sa.make_url(pg_url).set(port=proxy.port)
    store = WorkflowStore(url.render_as_string(hide_password=False))
    yield store
    store.close()


def step(step_id: str) -> PublishedStep:
    return PublishedStep(
        run_id=step_id,
        step_id=step_id,
        step_name="charge",
        rpc_name="shop.charge",
        data={"args": [1], "kwargs": {}},
        new_run=NewRun("shop.charge", {"args": [1]}, {"type": "task"}),
    )


def published_event(step_id: str) -> dict[str, object]:
    """A spooled publish of a lone task, as a worker's spool holds it."""
    return {
        "run_id": step_id,
        "step_id": step_id,
        "step_name": "ship",
        "rpc_name": "shop.ship",
        "data": {"args": [], "kwargs": {}},
        "new_run": {"workflow": "shop.ship", "input": {}, "wire": None},
        "eta": None,
    }


def wait_for(condition: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_events_of_an_outage_are_spooled_in_order_and_written_when_it_ends(
    proxied_store: WorkflowStore,
    proxy: TcpProxy,
    pg_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    mirror = CeleryMirror(proxied_store, spool_dir=tmp_path, drain_interval=0.05)
    direct = WorkflowStore(pg_url)
    before, during = str(uuid.uuid4()), str(uuid.uuid4())
    assert mirror.published(step(before)) == "charge"
    mirror.started(before, 1, worker="w", pid=1, adopt=lambda: step(before))

    proxy.cut()
    with caplog.at_level(logging.WARNING, logger="pikku_celery.integration.mirror"):
        mirror.retried(before, 1, ERROR, None)
        mirror.started(before, 2, worker="w", pid=2, adopt=lambda: step(before))
        mirror.succeeded(before, before, 2, {"paid": True})
        # The publishing side too: a step published during the outage.
        assert mirror.published(step(during)) is None
        mirror.started(during, 1, worker="w", pid=3, adopt=lambda: step(during))
        mirror.succeeded(during, during, 1, [1, 2])
        assert mirror.spool_depth == 6
        assert spool_depth(tmp_path) == 6
        assert direct.get_run(before).status == "running"  # nothing reached the database
        proxy.restore()
        wait_for(lambda: mirror.spool_depth == 0)
        wait_for(lambda: "mirror_caught_up" in [getattr(r, "action", "") for r in caplog.records])

    caught_up = [r for r in caplog.records if getattr(r, "action", "") == "mirror_caught_up"]
    assert [getattr(r, "count", None) for r in caught_up] == [6]
    assert [(a.attempt, a.status) for a in direct.get_run_history(before)] == [
        (1, "failed"),
        (2, "succeeded"),
    ]
    assert direct.get_run(before).output == {"paid": True}
    run = direct.get_run(during)
    assert (run.status, run.output) == ("completed", [1, 2])
    assert [(a.attempt, a.status) for a in direct.get_run_history(during)] == [(1, "succeeded")]
    # Back to normal: the next event goes straight to the database.
    mirror.published(step(str(uuid.uuid4())))
    assert mirror.spool_depth == 0
    mirror.close()
    assert not list(mirror.spool_folder.glob("*.spool"))  # an empty spool is removed
    direct.close()


def test_a_spool_left_by_a_dead_process_is_adopted_and_replayed(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = CeleryMirror(store, spool_dir=tmp_path)
    step_id = str(uuid.uuid4())
    left = Spool(mirror.spool_folder / "elsewhere-4242.spool")
    left.append("published", json.dumps(published_event(step_id)))
    left.append(
        "started",
        json.dumps({"step_id": step_id, "attempt": 1, "worker": "w", "pid": 9, "adopt": None}),
    )
    left.append(
        "succeeded",
        json.dumps({"run_id": step_id, "step_id": step_id, "attempt": 1, "result": "shipped"}),
    )
    # While its process lives (holds the lock), nobody else touches it.
    assert list(orphaned_spools(mirror.spool_folder)) == []
    left.close(delete_if_empty=False)  # the process ends; its lock goes with it

    assert mirror.adopt_orphans() == 3
    run = store.get_run(step_id)
    assert (run.status, run.output) == ("completed", "shipped")
    assert not list(mirror.spool_folder.glob("*.spool"))
    assert mirror.adopt_orphans() == 0  # replayed once, never twice


def test_a_spool_is_locked_to_its_owner_and_keeps_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "me.spool")
    with pytest.raises(OSError):
        Spool(tmp_path / "me.spool")  # a second owner is refused
    for n in range(5):
        spool.append("started", json.dumps({"n": n}))
    batch = spool.peek(3)
    assert [json.loads(e.payload)["n"] for e in batch] == [0, 1, 2]
    spool.remove_through(batch[-1].seq)
    assert [json.loads(e.payload)["n"] for e in spool.peek()] == [3, 4]
    assert spool.depth() == 2
    spool.close()
    assert (tmp_path / "me.spool").exists()  # not empty: kept for whoever adopts it


def test_spool_command_counts_and_replays_left_over_events(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pikku_celery.cli import main

    store = WorkflowStore(pg_url)
    mirror = CeleryMirror(store, spool_dir=tmp_path)
    step_id = str(uuid.uuid4())
    left = Spool(mirror.spool_folder / "gone-1.spool")
    left.append("published", json.dumps(published_event(step_id)))
    left.close(delete_if_empty=False)
    base = ["--database-url", pg_url, "spool", "--spool-dir", str(tmp_path)]
    assert main(base) == 0
    assert "1 mirror events wait in 1 spool files" in capsys.readouterr().out
    assert main([*base, "--replay"]) == 0
    out = capsys.readouterr().out
    assert "Replayed 1 events" in out and "0 still wait" in out
    assert store.get_step_state(step_id, "ship").status == "scheduled"
    store.close()


def test_two_mirrors_of_one_database_in_one_process_each_keep_their_events(
    tmp_path: Path,
) -> None:
    dead = WorkflowStore("postgresql://nobody@127.0.0.1:1/none")
    mirrors = [
        CeleryMirror(dead, retry_delays=(), spool_dir=tmp_path, drain_interval=60) for _ in range(2)
    ]
    for mirror in mirrors:
        mirror.succeeded("r", "s", 1, "result")
    assert [m.spool_depth for m in mirrors] == [1, 1]
    assert spool_depth(tmp_path) == 2
    for mirror in mirrors:
        mirror.close()
    dead.close()
