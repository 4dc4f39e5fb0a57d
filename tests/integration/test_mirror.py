"""The mirror between Celery's events and the store: journaled, batched, convergent, never
in the way. Flushes are made by the tests here (``background=False``) so each
batch holds exactly what a test says."""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.mirror import PublishedStep, Recorder, result_stored
from pikku_celery.mirror.apply import Pending, plan
from pikku_celery.mirror.events import MirrorEvent, decode
from pikku_celery.store import MirrorBatch, NewStep, RunOutcome, StepTransition
from tests.support import transitions
from tests.support.published import lone, own_journal
from tests.support.statements import count_statements
from tests.support.threads import run_threads

Event = Callable[[Recorder, str, str], None]
ERROR = {"type": "ValueError", "message": "t", "traceback": None}


def mirror_of(store: WorkflowStore, tmp_path: Path) -> Recorder:
    return Recorder(store, journal_dir=tmp_path / uuid.uuid4().hex, background=False)


def running_lone_task(mirror: Recorder) -> str:
    """A lone task published and started (attempt 1), as the handlers journal it."""
    step_id = str(uuid.uuid4())
    mirror.published(lone(step_id))
    mirror.started(step_id, 1, worker="w", pid=1)
    return step_id


# What the handlers hand the mirror for: attempt 1 retried, attempt 2 succeeds.
STORY: list[tuple[str, Event]] = [
    ("published", lambda m, r, s: m.published(lone(s))),
    ("1 started", lambda m, r, s: m.started(s, 1, worker="w", pid=1)),
    (
        "1 retried",
        lambda m, r, s: m.retried(s, 1, ERROR, dt.datetime.now(dt.timezone.utc)),
    ),
    ("2 started", lambda m, r, s: m.started(s, 2, worker="w", pid=2)),
    ("2 succeeded", lambda m, r, s: m.succeeded(r, s, 2, {"ok": True})),
]


def recorded(mirror: Recorder) -> list[MirrorEvent]:
    """Every event the mirror journals from now on, in order."""
    sent: list[MirrorEvent] = []
    sink = mirror.sink
    append = sink.append

    def record(event: MirrorEvent) -> None:
        sent.append(event)
        append(event)

    sink.append = record  # type: ignore[method-assign]
    return sent


def outcome(store: WorkflowStore, run_id: str) -> tuple[object, ...]:
    run = store.get_run(run_id)
    history = store.get_run_history(run_id)
    return (
        run.status,
        repr(run.output),
        tuple((a.attempt, a.status, a.delivery_count) for a in history),
        store.get_step_state(run_id, "charge").status,
    )


EXPECTED = ("completed", repr({"ok": True}), ((1, "failed", 1), (2, "succeeded", 1)), "succeeded")


def test_events_in_every_order_and_batching_converge(store: WorkflowStore, tmp_path: Path) -> None:
    outcomes = set()
    # The publish comes first in its own process; the worker's events in any order,
    # each in a batch of its own or all in one, and the first two of them twice (the
    # same events again, as a journal written twice holds them).
    for order in itertools.permutations(STORY[1:]):
        for together in (False, True):
            mirror = mirror_of(store, tmp_path)
            sent = recorded(mirror)
            step_id = str(uuid.uuid4())
            for _, event in (STORY[0], *order):
                event(mirror, step_id, step_id)
                if not together:
                    assert mirror.flush()
            for again in sent[1:3]:
                mirror.append(again)
                if not together:
                    assert mirror.flush()
            assert mirror.flush()
            outcomes.add(outcome(store, step_id))
            mirror.close()
    assert outcomes == {EXPECTED}


def test_a_batch_applied_twice_changes_nothing(store: WorkflowStore, tmp_path: Path) -> None:
    mirror = mirror_of(store, tmp_path)
    step_id = str(uuid.uuid4())
    for _, event in STORY:
        event(mirror, step_id, step_id)
    journal = own_journal(mirror)
    pending = [Pending(e.seq, decode(e.kind, e.payload)) for e in journal.peek(100, time.time())]
    batch = plan(pending)
    store.batches.apply_batch(batch)
    first = outcome(store, step_id)
    store.batches.apply_batch(batch)  # a COMMIT whose outcome was lost, or a journal adopted twice
    assert outcome(store, step_id) == first == EXPECTED
    mirror.close(timeout=1)


def test_a_task_that_ends_before_its_start_is_flushed_is_one_write_with_both_times(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = mirror_of(store, tmp_path)
    step_id = str(uuid.uuid4())
    mirror.published(lone(step_id))
    assert mirror.flush()
    mirror.started(step_id, 1, worker="w", pid=1)
    time.sleep(0.01)
    mirror.succeeded(step_id, step_id, 1, 42)
    with count_statements(store.engine) as statements:
        assert mirror.flush()
    [attempt] = store.get_run_history(step_id)
    assert attempt.status == "succeeded" and attempt.delivery_count == 1
    assert attempt.running_at is not None and attempt.succeeded_at is not None
    assert attempt.running_at < attempt.succeeded_at  # each event kept its own time
    attempt_writes = [s for s in statements.touching("workflow_step_history") if "INSERT" in s]
    assert len(attempt_writes) == 1  # one transition, not two
    mirror.close()


def test_a_result_that_is_not_json_is_kept_as_a_marked_placeholder(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = mirror_of(store, tmp_path)
    step_id = running_lone_task(mirror)
    mirror.succeeded(step_id, step_id, 1, {1, 2, 3})
    assert mirror.flush()
    [attempt] = store.get_run_history(step_id)
    assert attempt.status == "succeeded"
    assert attempt.result == {
        "__pikku_unserialisable__": True,
        "type": "builtins.set",
        "repr": "{1, 2, 3}",
    }
    assert store.get_run(step_id).status == "completed"
    mirror.close()


def test_a_step_published_without_pikku_is_adopted_when_it_starts(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = mirror_of(store, tmp_path)
    step_id = str(uuid.uuid4())
    adoption = mirror.adoption(step_id, "ship", "shop.ship", published=False, data={"args": [2]})
    mirror.started(step_id, 1, worker="w", pid=3, adoption=adoption)
    assert mirror.flush()
    [attempt] = store.get_run_history(step_id)
    assert (attempt.step_name, attempt.status, attempt.pid) == ("ship", "running", 3)
    assert store.get_step_state(step_id, "ship").data == {"args": [2]}
    mirror.close()


def chain_started(
    store: WorkflowStore, publisher: Recorder, worker: Recorder
) -> tuple[str, str, str]:
    """A chain of two ``add`` links: the first published (journaled, not flushed) and
    started by the worker, whose journal has not seen the second yet. Returns the run's
    id and the two links' task ids."""
    run_id = store.create_run("chain", None, wire={"type": "canvas"})
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    publisher.published(chain_link(run_id, first, None))
    adoption = worker.adoption(run_id, "add", "shop.add", published=True)
    worker.started(first, 1, worker="w", pid=1, adoption=adoption)
    return run_id, first, second


def chain_link(run_id: str, step_id: str, parent: str | None) -> PublishedStep:
    return PublishedStep(run_id, step_id, "add", "shop.add", {}, parent_step_id=parent)


def test_a_workers_events_wait_for_the_publish_and_names_keep_publish_order(
    store: WorkflowStore, tmp_path: Path
) -> None:
    publisher, worker = mirror_of(store, tmp_path), mirror_of(store, tmp_path)
    run_id, first, second = chain_started(store, publisher, worker)
    worker.succeeded(run_id, first, 1, 2)
    worker.published(chain_link(run_id, second, first))  # the chain's next link
    assert worker.flush()  # its step and its parent are not in SQL: everything waits
    assert store.list_step_states(run_id) == []
    assert worker.journal_depth == 3
    assert publisher.flush()
    time.sleep(0.05)  # the first retry of a deferred event
    assert worker.flush()
    assert worker.journal_depth == 0
    steps = {s.step_name: s for s in store.list_step_states(run_id)}
    assert set(steps) == {"add", "add#2"}
    assert steps["add"].step_id == first and steps["add"].status == "succeeded"
    assert steps["add#2"].step_id == second and steps["add#2"].from_step_name == "add"
    publisher.close()
    worker.close()


def test_a_steps_success_waits_behind_a_deferred_publish_of_its_run(
    store: WorkflowStore, tmp_path: Path
) -> None:
    """Celery publishes a chain's next link before its sender's success. When the link
    waits (the sender's own publish is not in SQL yet) and the success is read later, on
    its own, the success waits for the link: else the run completes without its next step."""
    publisher = mirror_of(store, tmp_path)
    # Deferred events come due one interval after they were deferred: long enough here
    # for the steps below to run between two of them on a loaded machine.
    worker = Recorder(store, journal_dir=tmp_path / "worker", background=False, flush_interval=0.5)
    run_id, first, second = chain_started(store, publisher, worker)
    worker.published(chain_link(run_id, second, first))
    assert worker.flush()  # both wait for the first link's publish
    worker.succeeded(run_id, first, 1, 2)  # appended after that flush read the journal
    assert publisher.flush()
    assert worker.flush()  # the two deferred are not due yet: the success waits with them
    assert store.get_run(run_id).status == "running"
    assert [s.status for s in store.list_step_states(run_id)] == ["scheduled"]
    time.sleep(0.55)  # the first retry of a deferred event
    assert worker.flush()
    assert worker.journal_depth == 0
    steps = {s.step_name: s.status for s in store.list_step_states(run_id)}
    assert steps == {"add": "succeeded", "add#2": "scheduled"}
    assert store.get_run(run_id).status == "running"
    publisher.close()
    worker.close()


def test_a_steps_success_waits_for_a_deferred_publish_even_when_the_links_start_is_due(
    store: WorkflowStore, tmp_path: Path
) -> None:
    """The chain's next link waits (its sender's publish is not in SQL yet); the sender's
    success and the link's start come due before the link's publish does. The success
    still waits for the publish itself, not for any event of the link: else the run
    completes without the link (CI saw a chain's run end with its body's result)."""
    publisher = mirror_of(store, tmp_path)
    # Deferred events come due one interval after they were deferred: long enough here
    # for the steps below to run between two of them on any machine.
    worker = Recorder(store, journal_dir=tmp_path / "worker", background=False, flush_interval=0.5)
    run_id = store.create_run("chain", None, wire={"type": "canvas"})
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    publisher.published(chain_link(run_id, first, None))  # journaled, not flushed yet
    worker.published(chain_link(run_id, second, first))  # sent by the first link
    assert worker.flush()  # the link waits for its sender's publish
    worker.succeeded(run_id, first, 1, 2)
    adoption = worker.adoption(run_id, "add", "shop.add", published=True)
    worker.started(second, 1, worker="w", pid=1, adoption=adoption)
    assert publisher.flush()
    assert worker.flush()  # the link's publish is not due yet: the success waits for it
    assert store.get_run(run_id).status == "running"
    deadline = time.monotonic() + 10
    while worker.journal_depth:
        assert time.monotonic() < deadline
        time.sleep(0.1)
        assert worker.flush()
    steps = {s.step_name: s.status for s in store.list_step_states(run_id)}
    assert steps == {"add": "succeeded", "add#2": "running"}
    assert store.get_run(run_id).status == "running"
    publisher.close()
    worker.close()


def test_a_steps_later_events_wait_behind_its_deferred_start_in_the_same_journal(
    store: WorkflowStore, tmp_path: Path
) -> None:
    """A message rejected with requeue and delivered again: its first start waits for the
    publish (not in SQL yet); the second start and the success, read by a later flush, wait
    behind it, so the attempt is never succeeded with one delivery counted of two."""
    publisher = mirror_of(store, tmp_path)
    # The deferred start comes due one interval after it was deferred: long enough here for
    # the steps below to run before it does on a loaded machine.
    worker = Recorder(store, journal_dir=tmp_path / "worker", background=False, flush_interval=0.5)
    step_id = str(uuid.uuid4())
    publisher.published(lone(step_id))  # journaled, not flushed yet
    worker.started(step_id, 1, worker="w", pid=1)
    assert worker.flush()  # the start waits for the publish
    worker.started(step_id, 1, worker="w", pid=2)  # delivered again
    worker.succeeded(step_id, step_id, 1, "done")
    assert publisher.flush()
    assert worker.flush()  # the first start is not due yet: the two others wait behind it
    [attempt] = store.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count) == ("scheduled", 0)
    deadline = time.monotonic() + 5
    while worker.journal_depth:
        assert time.monotonic() < deadline
        time.sleep(0.02)
        assert worker.flush()
    [attempt] = store.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count) == ("succeeded", 2)
    publisher.close()
    worker.close()


def test_a_lone_task_published_twice_or_adopted_first_is_written_once(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = mirror_of(store, tmp_path)
    twice, adopted = str(uuid.uuid4()), str(uuid.uuid4())
    mirror.published(lone(twice))
    mirror.published(lone(twice))  # its message sent again, in the same batch
    # Started by a worker (and adopted there) before its publish was written.
    adoption = mirror.adoption(
        adopted, "charge", "shop.charge", published=False, data={"args": [1]}
    )
    mirror.started(adopted, 1, worker="w", pid=1, adoption=adoption)
    assert mirror.flush()
    mirror.published(lone(adopted))
    assert mirror.flush()
    assert mirror.journal_depth == 0
    assert [(a.attempt, a.status) for a in store.get_run_history(twice)] == [(1, "scheduled")]
    assert [(a.attempt, a.status) for a in store.get_run_history(adopted)] == [(1, "running")]
    assert [s.step_name for s in store.list_step_states(twice)] == ["charge"]
    mirror.close()


def test_a_poison_event_is_set_aside_and_the_rest_of_its_batch_lands(
    store: WorkflowStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mirror = mirror_of(store, tmp_path)
    good, bad = str(uuid.uuid4()), str(uuid.uuid4())
    mirror.published(lone(good))
    mirror.published(lone(bad))
    mirror.ended(bad, bad, 1, "exploded", ERROR)  # a status no attempt can have
    mirror.started(good, 1, worker="w", pid=1)
    mirror.succeeded(good, good, 1, "fine")
    with caplog.at_level(logging.ERROR, logger="pikku_celery.mirror"):
        assert mirror.flush()
    assert store.get_run(good).status == "completed"
    assert store.get_step_state(bad, "charge").status == "scheduled"
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "mirror_event_set_aside"]
    assert getattr(record, "event", None) == "ended"
    assert "journal --replay" in record.getMessage()
    journal = own_journal(mirror)
    assert (journal.depth(), journal.set_aside_count()) == (0, 1)
    mirror.close()
    assert list(mirror.journal_folder.glob("*.journal"))  # kept: it holds a set-aside event


def test_a_failure_from_the_workers_main_process_ends_the_current_attempt_and_run(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = mirror_of(store, tmp_path)
    step_id = running_lone_task(mirror)
    mirror.retried(step_id, 1, ERROR, None)
    mirror.started(step_id, 2, worker="w", pid=1)
    assert mirror.flush()
    # No request context there: no attempt number, no run id.
    mirror.ended(None, step_id, None, "failed", {**ERROR, "type": "TimeLimitExceeded"})
    assert mirror.flush()
    history = store.get_run_history(step_id)
    assert [(a.attempt, a.status) for a in history] == [(1, "failed"), (2, "failed")]
    assert history[1].error is not None and history[1].error["type"] == "TimeLimitExceeded"
    run = store.get_run(step_id)
    assert run.status == "failed"
    mirror.close()


def test_a_workflow_step_end_is_handed_on_only_after_it_is_committed(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = mirror_of(store, tmp_path)
    run_id = store.create_run("checkout", None, wire={"type": "workflow"})
    step_id = str(uuid.uuid4())
    assert store.claims.claim_step(run_id, step_id, "charge", "shop.charge", None)
    seen: list[tuple[str, str]] = []

    def replay(run_ids: object) -> None:
        # What a replay would read: the step's end is already there.
        for one in run_ids:  # type: ignore[attr-defined]
            seen.append((one, store.get_step(step_id).status))

    mirror.on_committed(replay)
    mirror.started(step_id, 1, worker="w", pid=1)
    mirror.succeeded(None, step_id, 1, "paid", orchestrated=True)
    assert seen == []  # journaled only: nothing replays yet
    assert mirror.flush()
    assert seen == [(run_id, "succeeded")]
    assert store.get_run(run_id).status == "running"  # the workflow decides its outcome
    mirror.close()


def test_an_unreachable_database_never_raises_and_keeps_events_in_the_journal(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    dead = WorkflowStore("postgresql://nobody:s3cret@127.0.0.1:1/none")
    mirror = Recorder(dead, journal_dir=tmp_path, background=False)
    with caplog.at_level(logging.WARNING, logger="pikku_celery.mirror"):
        mirror.published(
            PublishedStep(run_id="r", step_id="s", step_name="n", rpc_name="t", data={})
        )
        mirror.succeeded("r", "s", 1, "result")
        assert mirror.flush() is False
        assert mirror.flush() is False
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions == ["mirror_spooling"]  # said once per outage, not once per flush
    assert "cannot reach the workflow database" in caplog.records[0].getMessage()
    assert "s3cret" not in caplog.records[0].getMessage()
    assert mirror.journal_depth == 2
    mirror.close(timeout=0.5)
    assert any(mirror.journal_folder.glob("*.journal"))  # left for whoever adopts it
    dead.close()


def test_a_batch_is_one_transaction_whatever_it_holds(store: WorkflowStore, tmp_path: Path) -> None:
    mirror = mirror_of(store, tmp_path)
    ids = [str(uuid.uuid4()) for _ in range(20)]
    for step_id in ids:
        for _, event in STORY:
            event(mirror, step_id, step_id)
    ledger = sa.text("SELECT count(*) FROM pikku_celery_deliveries")
    with store.engine.connect() as conn:
        before = conn.execute(ledger).scalar_one()
    with count_statements(store.engine) as statements:
        assert mirror.flush()
    assert statements.commits == 1
    writes = [v for v in statements.verbs() if v in ("INSERT", "UPDATE", "WITH")]
    # Each kind of statement once for the 20 tasks (100 events), never once per event.
    assert len(writes) <= 12, writes
    assert {outcome(store, step_id) for step_id in ids} == {EXPECTED}
    with store.engine.connect() as conn:
        counted = conn.execute(ledger).scalar_one() - before
    assert counted == 40  # two starts per task, each counted once by its event id
    mirror.close()


def test_the_ledger_of_counted_deliveries_forgets_old_ones(
    store: WorkflowStore, tmp_path: Path
) -> None:
    mirror = mirror_of(store, tmp_path)
    running_lone_task(mirror)
    assert mirror.flush()
    ledger = sa.text("SELECT count(*) FROM pikku_celery_deliveries")
    with store.engine.connect() as conn:
        before = conn.execute(ledger).scalar_one()
    now = dt.datetime.now(dt.timezone.utc)
    assert store.batches.prune_deliveries(now - dt.timedelta(days=1)) == 0  # nothing that old
    assert store.batches.prune_deliveries(now + dt.timedelta(seconds=1)) >= 1
    with store.engine.connect() as conn:
        assert conn.execute(ledger).scalar_one() < before
    mirror.close()


@pytest.mark.postgres
def test_two_processes_naming_steps_of_one_run_at_once_lose_no_step(
    pg_url: str, tmp_path: Path
) -> None:
    stores = [WorkflowStore(pg_url) for _ in range(2)]
    mirrors = [mirror_of(store, tmp_path) for store in stores]
    run_id = stores[0].create_run("fan-out", None, wire={"type": "canvas"})

    def publish(mirror: Recorder) -> None:
        for _ in range(40):
            mirror.published(PublishedStep(run_id, str(uuid.uuid4()), "notify", "shop.notify", {}))
            mirror.flush()

    run_threads(2, lambda index: publish(mirrors[index]))
    deadline = time.monotonic() + 20
    while any(m.journal_depth for m in mirrors):  # a step that lost its name waits, then lands
        assert time.monotonic() < deadline
        time.sleep(0.05)
        for mirror in mirrors:
            mirror.flush()
    names = sorted(s.step_name for s in stores[0].list_step_states(run_id))
    assert names == sorted(["notify"] + [f"notify#{n}" for n in range(2, 81)])
    for mirror, store in zip(mirrors, stores, strict=True):
        mirror.close()
        store.close()


@pytest.mark.postgres
def test_two_last_steps_ending_at_once_in_two_processes_complete_their_run(
    pg_url: str, tmp_path: Path
) -> None:
    store = WorkflowStore(pg_url)
    run_id = store.create_run("pair", None, wire={"type": "canvas"})
    pair = [str(uuid.uuid4()), str(uuid.uuid4())]
    publisher = mirror_of(store, tmp_path)
    for step_id in pair:
        publisher.published(PublishedStep(run_id, step_id, "half", "shop.half", {}))
    assert publisher.flush()
    batches = []
    for index, step_id in enumerate(pair):  # each process ends one of the two steps
        worker = mirror_of(store, tmp_path)
        events = recorded(worker)
        worker.started(step_id, 1, worker="w", pid=index)
        worker.succeeded(run_id, step_id, 1, index)
        batches.append(plan([Pending(n, event) for n, event in enumerate(events)]))
        worker.close(timeout=0.1)
    second_done = threading.Event()

    def apply_second() -> None:
        store.batches.apply_batch(batches[1])
        second_done.set()

    with store.transaction() as first:
        store.batches.apply_batch(batches[0], conn=first)  # not committed yet
        other = threading.Thread(target=apply_second, daemon=True)
        other.start()
        # The second batch waits for the run's lock instead of judging on what it sees now.
        assert not second_done.wait(0.5)
    other.join(10)
    assert second_done.is_set()
    assert store.get_run(run_id).status == "completed"
    publisher.close()
    store.close()


def test_sqlite_batches_of_several_processes_take_the_write_lock_in_turn(
    tmp_path: Path,
) -> None:
    import fcntl

    path = tmp_path / "turns.db"
    store = WorkflowStore(f"sqlite:///{path}")
    store.init()
    mirror = mirror_of(store, tmp_path)
    step_id = str(uuid.uuid4())
    mirror.published(lone(step_id))
    done = threading.Event()

    def flush() -> None:
        mirror.flush()
        done.set()

    with open(f"{path}-pikku-writers", "a+b") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)  # another process's batch is being written
        flusher = threading.Thread(target=flush, daemon=True)
        flusher.start()
        assert not done.wait(0.3)  # queued behind it, not sleeping in SQLite's busy handler
        fcntl.flock(turn, fcntl.LOCK_UN)
    flusher.join(10)
    assert done.is_set()
    assert store.get_step_state(step_id, "charge").status == "scheduled"
    mirror.close()
    store.close()


def test_a_tasks_retry_delay_lands_as_a_duration_string_and_a_bad_one_is_left_out(
    store: WorkflowStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mirror = mirror_of(store, tmp_path)
    published, adopted, odd = (str(uuid.uuid4()) for _ in range(3))
    mirror.published(replace(lone(published), retry_delay=0.2, retries=2))
    mirror.started(
        adopted,
        1,
        worker="w",
        pid=3,
        adoption=mirror.adoption(
            adopted, "ship", "shop.ship", published=False, data={}, retry_delay=180
        ),
    )
    # A task option set by hand to a delay no duration expresses: the task is not failed.
    mirror.published(replace(lone(odd, "odd"), retry_delay=-1))
    with caplog.at_level(logging.WARNING, logger="pikku_celery.store"):
        assert mirror.flush()
    assert store.get_step_state(published, "charge").retry_delay == "200ms"
    assert store.get_step_state(adopted, "ship").retry_delay == "180s"
    assert store.get_step_state(odd, "odd").retry_delay is None
    [warned] = [r for r in caplog.records if getattr(r, "action", "") == "retry_delay_left_out"]
    assert warned.levelno == logging.WARNING and getattr(warned, "step_id", None) == odd
    mirror.close()


def test_a_retrys_delay_in_seconds_lands_formatted_once_and_a_zero_delay_counts(
    store: WorkflowStore, tmp_path: Path
) -> None:
    """The events carry seconds; the row gets the duration string. A retry with no
    countdown (0 seconds) replaces the delay the step had, as any other retry does."""
    mirror = mirror_of(store, tmp_path)
    step_id = str(uuid.uuid4())
    mirror.published(replace(lone(step_id), retry_delay=5, retries=3))
    mirror.started(step_id, 1, worker="w", pid=1)
    mirror.retried(step_id, 1, ERROR, None, retries=3, retry_delay=1.5)
    assert mirror.flush()
    assert store.get_step_state(step_id, "charge").retry_delay == "1500ms"
    mirror.started(step_id, 2, worker="w", pid=1)
    mirror.retried(step_id, 2, ERROR, None, retries=3, retry_delay=0.0)
    assert mirror.flush()
    step = store.get_step_state(step_id, "charge")
    assert (step.retry_delay, step.retry_delay_seconds) == ("0s", 0.0)
    mirror.close()


def test_a_run_whose_next_step_waits_to_be_written_is_not_completed_by_the_one_before(
    store: WorkflowStore,
) -> None:
    """A chain's next link is published before its sender succeeds; if that link must
    wait (the step it follows is not in SQL yet, or it lost a name race), the run stays
    open instead of completing with the sender's result."""
    run_id = store.create_run("chain", None, wire={"type": "canvas"})
    first, second, unknown = (str(uuid.uuid4()) for _ in range(3))
    transitions.schedule(
        store, run_id, "inc", step_id=first, rpc_name="bench.inc", data={"args": [1], "kwargs": {}}
    )
    store.attempts.record_attempt(first, 1, "running")
    now = dt.datetime.now(dt.timezone.utc)
    waits = NewStep(
        run_id=run_id,
        step_id=second,
        step_name="inc",
        rpc_name="bench.inc",
        data_json='{"args": [2], "kwargs": {}}',
        at=now,
        parent_step_id=unknown,  # published by a process whose batch has not landed
    )
    result = store.batches.apply_batch(
        MirrorBatch(
            steps=[waits],
            transitions=[StepTransition(first, 1, "succeeded", now, result_json="2")],
            outcomes=[RunOutcome(first, run_id, "complete", now)],
        )
    )
    assert second in result.missing
    assert store.get_step_state(run_id, "inc").status == "succeeded"
    assert store.get_run(run_id).status == "running"
    # Its parent lands; then it is written, runs and succeeds: now the run is done.
    transitions.schedule(store, run_id, "noop", step_id=unknown, rpc_name="bench.noop")
    store.attempts.record_attempt(unknown, 1, "succeeded", result=None)
    store.batches.apply_batch(MirrorBatch(steps=[replace(waits, at=now)]))
    assert store.get_run(run_id).status == "running"
    store.batches.apply_batch(
        MirrorBatch(
            transitions=[StepTransition(second, 1, "succeeded", now, result_json="3")],
            outcomes=[RunOutcome(second, run_id, "complete", now)],
        )
    )
    run = store.get_run(run_id)
    assert (run.status, run.output) == ("completed", 3)


def test_a_result_waits_behind_its_attempts_end_that_waits_for_the_step(
    store: WorkflowStore, tmp_path: Path
) -> None:
    # A worker's journal: the attempt's end, written while its step's publish (another
    # process's journal) is not in SQL yet, so it waits; then the step lands, then the
    # task's result is flushed on its own. The result must wait for the attempt's end:
    # a reader never sees SUCCESS before SQL shows the attempt succeeded.
    worker, publisher = mirror_of(store, tmp_path), mirror_of(store, tmp_path)
    try:
        step_id = str(uuid.uuid4())
        worker.started(step_id, 1, worker="w", pid=1)
        worker.succeeded(step_id, step_id, 1, 7)
        worker.flush()  # the step is not there: both wait
        publisher.published(lone(step_id))
        publisher.flush()
        worker.append(
            result_stored(step_id, 1, "SUCCESS", b'{"status": "SUCCESS", "result": 7}', None)
        )
        worker.flush()  # the result is due, its attempt's end is not yet
        result = store.results.get(step_id)
        attempt = store.get_step_state(step_id, "charge")
        assert result is None or attempt.status == "succeeded"
        time.sleep(0.1)  # the deferred events are due again
        worker.flush()
        assert store.get_step_state(step_id, "charge").status == "succeeded"
        stored = store.results.get(step_id)
        assert stored is not None and stored.status == "SUCCESS"
    finally:
        worker.close()
        publisher.close()
