"""The journal: every event is on local disk first, leaves it only after COMMIT, and a
journal whose process is gone is adopted and written by another process.

The outages are network cuts: the mirror talks to PostgreSQL through a proxy
the test owns (the shared server is never stopped).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.mirror import PublishedStep, Recorder, result_stored
from pikku_celery.mirror.events import AttemptStarted, AttemptSucceeded, encode
from pikku_celery.mirror.events import StepPublished as Published
from pikku_celery.mirror.journal import Journal, journal_depth, orphaned_journals
from pikku_celery.store.attempts import NewRun
from tests.support.published import own_journal
from tests.support.tcp_proxy import TcpProxy

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


def wait_for(condition: Callable[[], object], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def left_journal(folder: Path, step_id: str) -> Journal:
    """A journal as a process leaves it when it is killed: a publish, a start, a success."""
    journal = Journal(folder / "elsewhere-4242.journal")
    now = time.time()
    events = [
        Published(
            id=f"left-{step_id}-1",
            at=now,
            step_id=step_id,
            run_id=step_id,
            step_name="ship",
            rpc_name="shop.ship",
            data_json='{"args":[],"kwargs":{}}',
            new_run=("shop.ship", "{}", None),
        ),
        AttemptStarted(
            id=f"left-{step_id}-2", at=now, step_id=step_id, attempt=1, worker="w", pid=9
        ),
        AttemptSucceeded(
            id=f"left-{step_id}-3",
            at=now,
            step_id=step_id,
            attempt=1,
            run_id=step_id,
            result_json='"shipped"',
        ),
    ]
    for event in events:
        journal.append(event.kind, encode(event))
    return journal


def test_events_of_an_outage_wait_in_the_journal_in_order_and_are_written_when_it_ends(
    proxied_store: WorkflowStore,
    proxy: TcpProxy,
    pg_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    mirror = Recorder(proxied_store, journal_dir=tmp_path, flush_interval=0.01)
    direct = WorkflowStore(pg_url)
    before, during = str(uuid.uuid4()), str(uuid.uuid4())
    mirror.published(step(before))
    mirror.started(before, 1, worker="w", pid=1)
    wait_for(lambda: mirror.journal_depth == 0)
    assert direct.get_step_state(before, "charge").status == "running"

    proxy.cut()
    with caplog.at_level(logging.WARNING, logger="pikku_celery.mirror"):
        mirror.retried(before, 1, ERROR, None)
        mirror.started(before, 2, worker="w", pid=2)
        mirror.succeeded(before, before, 2, {"paid": True})
        mirror.published(step(during))
        mirror.started(during, 1, worker="w", pid=3)
        mirror.succeeded(during, during, 1, [1, 2])
        time.sleep(0.3)  # several flushes fail meanwhile
        assert mirror.journal_depth == 6
        assert journal_depth(tmp_path) == 6
        assert direct.get_run(before).status == "running"  # nothing reached the database
        proxy.restore()
        wait_for(lambda: mirror.journal_depth == 0)
        wait_for(lambda: "mirror_caught_up" in [getattr(r, "action", "") for r in caplog.records])

    actions = [getattr(r, "action", "") for r in caplog.records]
    assert actions.count("mirror_spooling") == 1  # said once per outage, not once per flush
    caught_up = [r for r in caplog.records if getattr(r, "action", "") == "mirror_caught_up"]
    assert [getattr(r, "count", None) for r in caught_up] == [6]
    assert [(a.attempt, a.status) for a in direct.get_run_history(before)] == [
        (1, "failed"),
        (2, "succeeded"),
    ]
    assert direct.get_run(before).output == {"paid": True}
    run = direct.get_run(during)
    assert (run.status, run.output) == ("completed", [1, 2])
    [attempt] = direct.get_run_history(during)
    assert (attempt.status, attempt.delivery_count) == ("succeeded", 1)
    mirror.close()
    assert not list(mirror.journal_folder.glob("*.journal"))  # an empty journal is removed
    direct.close()


def test_a_commit_whose_reply_is_lost_is_written_again_and_counts_each_delivery_once(
    proxied_store: WorkflowStore, proxy: TcpProxy, pg_url: str, tmp_path: Path
) -> None:
    mirror = Recorder(proxied_store, journal_dir=tmp_path, background=False)
    direct = WorkflowStore(pg_url)
    step_id = str(uuid.uuid4())
    mirror.published(step(step_id))
    mirror.started(step_id, 1, worker="w", pid=1)
    mirror.succeeded(step_id, step_id, 1, "ok")
    proxy.reset_after_reply_to(b"COMMIT")
    assert mirror.flush() is False  # the client saw its connection reset at COMMIT...
    assert mirror.journal_depth == 3  # ...so it keeps every event
    assert direct.get_run(step_id).status == "completed"  # but the server had committed
    assert mirror.flush() is True  # the same batch, written again
    assert mirror.journal_depth == 0
    [attempt] = direct.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count) == ("succeeded", 1)
    mirror.close()
    direct.close()


def test_a_journal_left_by_a_dead_process_is_adopted_and_written(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = Recorder(store, journal_dir=tmp_path)
    step_id = str(uuid.uuid4())
    left = left_journal(mirror.journal_folder, step_id)
    # While its process lives (holds the lock), nobody else touches it.
    assert list(orphaned_journals(mirror.journal_folder)) == []
    left.close(delete_if_empty=False)  # the process ends; its lock goes with it

    assert mirror.adopt_orphans() == 3
    run = store.get_run(step_id)
    assert (run.status, run.output) == ("completed", "shipped")
    assert not list(mirror.journal_folder.glob("*.journal"))
    assert mirror.adopt_orphans() == 0  # written once, never twice


def test_a_live_process_adopts_a_dead_processes_journal_within_seconds(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = Recorder(store, journal_dir=tmp_path, adopt_interval=0.2)
    mirror.start()  # as a worker's main process does at worker_ready
    step_id = str(uuid.uuid4())
    left_journal(mirror.journal_folder, step_id).close(delete_if_empty=False)
    wait_for(lambda: not list(mirror.journal_folder.glob("elsewhere-*")), timeout=5)
    assert store.get_run(step_id).status == "completed"
    mirror.close()


def test_a_journal_is_locked_to_its_owner_keeps_order_and_defers_in_place(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "me.journal")
    with pytest.raises(OSError):
        Journal(tmp_path / "me.journal")  # a second owner is refused
    for n in range(5):
        journal.append("started", f'{{"n": {n}}}')
    now = time.time()
    batch = journal.peek(3, now)
    assert [e.payload for e in batch] == ['{"n": 0}', '{"n": 1}', '{"n": 2}']
    journal.remove([batch[0].seq, batch[2].seq])
    journal.defer([batch[1].seq], now + 60, now)
    assert [e.payload for e in journal.peek(10, now)] == ['{"n": 3}', '{"n": 4}']
    [waiting] = journal.peek(10, now + 61)[:1]
    assert (waiting.payload, waiting.deferred_since) == ('{"n": 1}', now)
    journal.set_aside(waiting, "a test", now)
    assert (journal.depth(), journal.set_aside_count()) == (2, 1)
    journal.close()
    assert (tmp_path / "me.journal").exists()  # not empty: kept for whoever adopts it


def test_journal_command_counts_and_writes_left_over_events(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pikku_celery.cli import main

    store = WorkflowStore(pg_url)
    mirror = Recorder(store, journal_dir=tmp_path)
    step_id = str(uuid.uuid4())
    left_journal(mirror.journal_folder, step_id).close(delete_if_empty=False)
    base = ["--database-url", pg_url, "journal", "--journal-dir", str(tmp_path)]
    assert main(base) == 0
    assert "3 mirror events wait in 1 journal files" in capsys.readouterr().out
    assert main([*base, "--replay"]) == 0
    out = capsys.readouterr().out
    assert "Wrote 3 events" in out and "0 still wait" in out
    assert store.get_run(step_id).status == "completed"
    store.close()


def test_two_mirrors_of_one_database_in_one_process_each_keep_their_events(
    tmp_path: Path,
) -> None:
    dead = WorkflowStore("postgresql://nobody@127.0.0.1:1/none")
    mirrors = [Recorder(dead, journal_dir=tmp_path, adopt_interval=60) for _ in range(2)]
    for mirror in mirrors:
        mirror.succeeded("r", "s", 1, "result")
    assert [m.journal_depth for m in mirrors] == [1, 1]
    assert journal_depth(tmp_path) == 2
    for mirror in mirrors:
        mirror.close(timeout=0.5)
    dead.close()


def test_events_set_aside_are_written_by_journal_replay_once_their_cause_is_fixed(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pikku_celery.cli import main

    store = WorkflowStore(pg_url)
    mirror = Recorder(store, journal_dir=tmp_path, background=False)
    step_id = str(uuid.uuid4())
    mirror.published(step(step_id))
    real = store.batches.apply_batch

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug in this version")

    store.batches.apply_batch = broken  # type: ignore[assignment,method-assign]
    assert mirror.flush()  # set aside, not blocking anything
    store.batches.apply_batch = real  # type: ignore[method-assign]  # the fixed version
    journal = own_journal(mirror)
    assert (journal.depth(), journal.set_aside_count()) == (0, 1)
    mirror.close()  # the process ends; its journal stays, holding the event
    base = ["--database-url", pg_url, "journal", "--journal-dir", str(tmp_path)]
    assert main(base) == 0
    assert "1 set aside" in capsys.readouterr().out
    assert main([*base, "--replay"]) == 0
    assert "Wrote 1 events" in capsys.readouterr().out
    assert store.get_step_state(step_id, "charge").status == "scheduled"
    assert not list(mirror.journal_folder.glob("*.journal"))
    store.close()


def test_a_result_after_an_idle_spell_is_written_at_once_other_events_gather(
    store: WorkflowStore, tmp_path: Path
) -> None:
    # A long interval makes the difference plain: a get() waiting for a result does not
    # pay the interval the flusher waits to gather events into one batch.
    mirror = Recorder(store, journal_dir=tmp_path, flush_interval=3.0)
    try:
        gathered = str(uuid.uuid4())
        mirror.published(step(gathered))
        time.sleep(1.0)
        assert mirror.journal_depth == 1  # still gathering
        wait_for(lambda: mirror.journal_depth == 0)
        time.sleep(3.5)  # idle for more than the interval
        told = str(uuid.uuid4())
        began = time.monotonic()
        mirror.append(result_stored(told, 1, "SUCCESS", b'{"status": "SUCCESS"}', None))
        wait_for(lambda: store.results.get(told) is not None)
        assert time.monotonic() - began < 1.5
    finally:
        mirror.close()
