"""The reaper's guarded writes: lost once, redelivered onward, given up once."""

from __future__ import annotations

import datetime as dt
import uuid

from pikku_celery import WorkflowStore
from pikku_celery.store import MirrorBatch, StepTransition
from pikku_celery.store.attempts import NewRun
from tests.support import transitions
from tests.support.published import lone_step
from tests.support.steps import LOST, running_step


def test_open_attempts_lists_current_running_attempts_with_what_the_reaper_needs(
    store: WorkflowStore,
) -> None:
    run_id, step_id = running_step(store)
    done_run, done_step = running_step(store)
    store.attempts.record_attempt(done_step, 1, "succeeded", result=1)
    [found] = [a for a in store.reaping.open_attempts() if a.run_id in (run_id, done_run)]
    assert (found.step_id, found.attempt, found.status, found.worker, found.pid) == (
        step_id,
        1,
        "running",
        "w1@host",
        7,
    )
    assert (found.run_kind, found.rpc_name, found.retries, found.delivery_count) == (
        "task",
        "shop.charge",
        1,
        1,
    )
    assert found.data == {"args": [1], "kwargs": {}}
    # Not idle for an hour yet: not a candidate.
    assert step_id not in [a.step_id for a in store.reaping.open_attempts(idle_for=3600)]


def test_an_attempt_is_lost_once_and_only_for_the_delivery_that_was_seen(
    store: WorkflowStore,
) -> None:
    run_id, step_id = running_step(store)
    assert not store.reaping.mark_lost(step_id, 1, 2, LOST)  # a redelivery the reaper never saw
    assert store.reaping.mark_lost(step_id, 1, 1, LOST)
    assert not store.reaping.mark_lost(step_id, 1, 1, LOST)  # a second reaper changes nothing
    step = store.get_step_state(run_id, "charge")
    assert (step.status, step.error and step.error["worker"]) == ("lost", "w1@host")
    [attempt] = store.get_run_history(run_id)
    assert (attempt.status, attempt.failed_at) == ("lost", None)
    assert store.get_run(run_id).status == "running"


def test_a_redelivery_continues_a_lost_attempt_and_its_outcome_clears_the_loss(
    store: WorkflowStore,
) -> None:
    run_id, step_id = running_step(store)
    assert store.reaping.mark_lost(step_id, 1, 1, LOST)
    store.attempts.record_attempt(step_id, 1, "running", worker="w2@host", pid=8, task_id=step_id)
    [attempt] = store.get_run_history(run_id)
    assert (attempt.status, attempt.delivery_count, attempt.worker) == ("running", 2, "w2@host")
    assert store.get_step_state(run_id, "charge").status == "running"
    store.attempts.record_attempt(step_id, 1, "succeeded", result="ok")
    store.attempts.complete_run_if_done(run_id)
    [attempt] = store.get_run_history(run_id)
    assert (attempt.status, attempt.error, attempt.result) == ("succeeded", None, "ok")
    assert store.get_run(run_id).status == "completed"


def test_giving_up_with_retries_left_schedules_a_new_attempt_once(store: WorkflowStore) -> None:
    run_id, step_id = running_step(store)
    store.reaping.mark_lost(step_id, 1, 1, LOST)
    assert store.reaping.give_up_lost(run_id, step_id, 1, LOST, retry=True, settle_run=True)
    assert not store.reaping.give_up_lost(run_id, step_id, 1, LOST, retry=True, settle_run=True)
    history = store.get_run_history(run_id)
    assert [(a.attempt, a.status, a.reason) for a in history] == [
        (1, "lost", "first"),
        (2, "scheduled", "lost"),
    ]
    # The lost attempt ended as it was given up, before its successor began.
    lost, following = history
    assert lost.failed_at is not None and lost.failed_at < following.created_at
    assert lost.error is not None and lost.error["type"] == LOST["type"]
    assert following.failed_at is None
    step = store.get_step_state(run_id, "charge")
    assert (step.status, step.attempt_count, step.error) == ("scheduled", 2, None)
    assert store.get_run(run_id).status == "running"


def test_giving_up_for_good_fails_the_step_and_the_run(store: WorkflowStore) -> None:
    run_id, step_id = running_step(store, retries=0)
    store.reaping.mark_lost(step_id, 1, 1, LOST)
    assert store.reaping.give_up_lost(run_id, step_id, 1, LOST, retry=False, settle_run=True)
    step = store.get_step_state(run_id, "charge")
    assert (step.status, step.error and step.error["type"]) == ("failed", LOST["type"])
    run = store.get_run(run_id)
    assert (run.status, run.error and run.error["message"]) == ("failed", "gone")
    [attempt] = store.get_run_history(run_id)
    assert attempt.status == "lost"  # the history still says what happened
    assert attempt.failed_at is not None  # and when it was given up


def test_only_an_attempt_still_lost_is_given_up(store: WorkflowStore) -> None:
    run_id, step_id = running_step(store)
    store.reaping.mark_lost(step_id, 1, 1, LOST)
    store.attempts.record_attempt(
        step_id, 1, "running", worker="w2@host", task_id=step_id
    )  # redelivered
    assert not store.reaping.give_up_lost(run_id, step_id, 1, LOST, retry=False, settle_run=True)
    assert store.get_run(run_id).status == "running"


def test_stale_scheduled_lists_old_messages_but_not_ones_held_back_on_purpose(
    store: WorkflowStore,
) -> None:
    run_id, step_id = str(uuid.uuid4()), str(uuid.uuid4())
    later_run, later_step = str(uuid.uuid4()), str(uuid.uuid4())
    transitions.schedule(
        store, run_id, "a", step_id=step_id, rpc_name="shop.a", data={}, new_run=NewRun("a", {})
    )
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    transitions.schedule(
        store,
        later_run,
        "b",
        step_id=later_step,
        rpc_name="shop.b",
        data={},
        eta=future,
        new_run=NewRun("b", {}),
    )
    stale = {s.step_id: s for s in store.reaping.stale_scheduled(older_than=0)}
    assert step_id in stale and later_step not in stale
    assert (stale[step_id].step_name, stale[step_id].attempt) == ("a", 1)
    assert step_id not in [s.step_id for s in store.reaping.stale_scheduled(older_than=3600)]


def test_the_same_start_written_again_leaves_a_lost_attempt_lost(store: WorkflowStore) -> None:
    # A worker killed between its batch's COMMIT and its journal's checkpoint: the process
    # that adopts the journal writes the start again, after the reaper gave the attempt up.
    # Only a delivery counted now (a redelivery) moves a lost attempt on.
    step_id = str(uuid.uuid4())
    at = dt.datetime.now(dt.timezone.utc)
    published = lone_step(step_id, at)

    def start(delivery: str, worker: str) -> MirrorBatch:
        moment = dt.datetime.now(dt.timezone.utc)
        running = StepTransition(
            step_id,
            1,
            "running",
            moment,
            running_at=moment,
            worker=worker,
            pid=7,
            task_id=step_id,
            delivery_ids=(delivery,),
        )
        return MirrorBatch(transitions=[running])

    store.batches.apply_batch(MirrorBatch(steps=[published]))
    first = start("d1", "w1@host")
    store.batches.apply_batch(first)
    assert store.reaping.mark_lost(step_id, 1, 1, LOST)
    store.batches.apply_batch(first)  # the adopted journal's copy of the same start
    [attempt] = store.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count, attempt.worker) == ("lost", 1, "w1@host")
    store.batches.apply_batch(start("d2", "w2@host"))  # a redelivery
    [attempt] = store.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count, attempt.worker) == ("running", 2, "w2@host")
