"""Attempt-addressed writes: events in any order, twice, late — the mirror converges."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import RunNotFound, StepNotFound, WorkflowStore
from pikku_celery.mirror.apply import Pending, plan
from pikku_celery.mirror.events import AttemptStarted, AttemptSucceeded, StepPublished
from pikku_celery.store.attempts import NewRun
from tests.conftest import truncate
from tests.support import transitions
from tests.support.statements import count_statements

Event = Callable[[WorkflowStore, str], None]


def scheduled_step(store: WorkflowStore, name: str = "charge") -> tuple[str, str]:
    run_id = str(uuid.uuid4())
    step_id = transitions.schedule(
        store,
        run_id,
        name,
        rpc_name=f"shop.{name}",
        data={"args": [1]},
        new_run=NewRun("charge", {"o": 1}),
    )
    assert store.get_step(step_id).step_name == name
    return run_id, step_id


def test_publish_records_a_scheduled_step_and_its_run(store: WorkflowStore) -> None:
    run_id, step_id = scheduled_step(store)
    run = store.get_run(run_id)
    assert (run.workflow, run.status, run.input) == ("charge", "running", {"o": 1})
    state = store.get_step_state(run_id, "charge")
    assert (state.step_id, state.status, state.attempt_count, state.data) == (
        step_id,
        "scheduled",
        1,
        {"args": [1]},
    )
    [attempt] = store.get_run_history(run_id)
    assert (attempt.attempt, attempt.status, attempt.reason) == (1, "scheduled", "first")
    assert attempt.scheduled_at is not None


def test_republish_of_the_same_step_changes_nothing(store: WorkflowStore) -> None:
    run_id, step_id = scheduled_step(store)
    # The same message published again (a retry republishes it with the same id).
    again = transitions.schedule(
        store,
        run_id,
        "charge",
        step_id=step_id,
        rpc_name="shop.charge",
        data={},
        new_run=NewRun("charge", {"o": 2}),
    )
    assert again == step_id
    assert len(store.list_step_states(run_id)) == 1
    assert store.get_step_state(run_id, "charge").data == {"args": [1]}
    assert store.get_run(run_id).input == {"o": 1}


@pytest.mark.parametrize("name", ["add", "50%_off", "back\\slash", "a#b"])
def test_repeated_names_get_ordinals_in_publish_order(store: WorkflowStore, name: str) -> None:
    run_id = store.create_run("canvas", {})
    ids = [transitions.schedule(store, run_id, name, rpc_name="t.add", data=[]) for _ in range(3)]
    names = [store.get_step(step_id).step_name for step_id in ids]
    assert names == [name, f"{name}#2", f"{name}#3"]
    # A name that merely shares a prefix is a different step.
    other = transitions.schedule(store, run_id, f"{name}x", data=[])
    assert store.get_step(other).step_name == f"{name}x"


def test_step_of_a_missing_run_is_reported_missing_and_not_written(store: WorkflowStore) -> None:
    # Its run may still be on its way (another process's batch): the step waits, unwritten.
    step = transitions.new_step(store, "no-run", "charge", step_id="s", data=[])
    assert transitions.apply(store, steps=[step]).missing == {"s"}
    assert store.list_step_states("no-run") == []
    with pytest.raises(RunNotFound):
        store.get_run("no-run")


def test_running_event_is_one_round_trip(store: WorkflowStore) -> None:
    run_id, step_id = scheduled_step(store)
    with count_statements(store.engine) as log:
        store.attempts.record_attempt(
            step_id, 1, "running", task_id=step_id, worker="w1", pid=7, run_id=run_id
        )
    if store.dialect == "postgresql":
        assert len(log) == 1
    else:
        assert log.verbs() == ["UPDATE", "INSERT"]  # the attempt row is upserted
    # A caller that names only the step pays one look-up of its run first.
    with count_statements(store.engine) as log:
        store.attempts.record_attempt(step_id, 1, "succeeded", result=1)
    assert log.verbs()[0] == "SELECT"
    assert len(log) == (2 if store.dialect == "postgresql" else 3)
    assert [a.status for a in store.get_run_history(run_id)] == ["succeeded"]


def test_execution_details_are_recorded(store: WorkflowStore) -> None:
    run_id, step_id = scheduled_step(store)
    store.attempts.record_attempt(
        step_id, 1, "running", task_id="celery-id", worker="celery@a", pid=42
    )
    store.attempts.record_attempt(step_id, 1, "succeeded", result={"paid": True})
    [attempt] = store.get_run_history(run_id)
    assert (attempt.status, attempt.result, attempt.task_id, attempt.worker, attempt.pid) == (
        "succeeded",
        {"paid": True},
        "celery-id",
        "celery@a",
        42,
    )
    assert attempt.delivery_count == 1
    assert attempt.running_at is not None and attempt.succeeded_at is not None


def retry_story() -> list[tuple[str, Event]]:
    """Attempt 1 runs and is retried; attempt 2 runs and succeeds (as Celery reports it)."""
    eta = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    return [
        ("1 running", lambda s, i: s.attempts.record_attempt(i, 1, "running", worker="w1")),
        (
            "1 failed + 2 scheduled",
            lambda s, i: (
                (
                    s.attempts.record_attempt(i, 1, "failed", error=ValueError("timeout")),
                    s.attempts.record_attempt(i, 2, "scheduled", eta=eta, reason="retry"),
                )
                and None
            ),
        ),
        ("2 running", lambda s, i: s.attempts.record_attempt(i, 2, "running", worker="w2")),
        ("2 succeeded", lambda s, i: s.attempts.record_attempt(i, 2, "succeeded", result="ok")),
    ]


def snapshot(store: WorkflowStore, run_id: str) -> tuple[Any, ...]:
    state = store.get_step_state(run_id, "charge")
    history = store.get_run_history(run_id)
    return (
        (state.status, state.attempt_count, state.result, state.error),
        [
            (
                a.attempt,
                a.status,
                a.result,
                a.error and a.error["message"],
                a.worker,
                a.delivery_count,
                a.eta is not None,
                a.running_at is not None,
            )
            for a in history
        ],
    )


def test_every_order_of_events_converges_to_the_ordered_outcome(store: WorkflowStore) -> None:
    story = retry_story()
    run_id, step_id = scheduled_step(store)
    for _, event in story:
        event(store, step_id)
    expected = snapshot(store, run_id)
    assert expected[0] == ("succeeded", 2, "ok", None)
    assert [row[:2] for row in expected[1]] == [(1, "failed"), (2, "succeeded")]

    for order in itertools.permutations(story):
        run_id, step_id = scheduled_step(store)
        for _, event in order:
            event(store, step_id)
        assert snapshot(store, run_id) == expected, [label for label, _ in order]


def test_duplicate_terminal_events_change_nothing(store: WorkflowStore) -> None:
    run_id, step_id = scheduled_step(store)
    store.attempts.record_attempt(step_id, 1, "running")
    store.attempts.record_attempt(step_id, 1, "succeeded", result=1)
    before = snapshot(store, run_id)
    store.attempts.record_attempt(step_id, 1, "succeeded", result=2)
    store.attempts.record_attempt(step_id, 1, "failed", error=ValueError("late"))
    store.attempts.record_attempt(step_id, 1, "scheduled")
    assert snapshot(store, run_id) == before


def test_redelivery_counts_on_the_same_attempt(store: WorkflowStore) -> None:
    run_id, step_id = scheduled_step(store)
    store.attempts.record_attempt(step_id, 1, "running", worker="w1", pid=1)
    store.attempts.record_attempt(
        step_id, 1, "running", worker="w2", pid=2
    )  # the message came back
    store.attempts.record_attempt(step_id, 1, "succeeded", result="ok")
    [attempt] = store.get_run_history(run_id)
    assert (attempt.attempt, attempt.status, attempt.delivery_count) == (1, "succeeded", 2)
    assert (attempt.worker, attempt.pid) == ("w2", 2)
    # Redelivered after it had already succeeded: counted, never rewound.
    store.attempts.record_attempt(step_id, 1, "running", worker="w3")
    [again] = store.get_run_history(run_id)
    assert (again.status, again.delivery_count, again.result) == ("succeeded", 3, "ok")


def test_attempt_row_is_created_when_it_is_missing(store: WorkflowStore) -> None:
    run_id, step_id = scheduled_step(store)
    store.attempts.record_attempt(step_id, 3, "running")  # attempts 2 and 3 never announced
    state = store.get_step_state(run_id, "charge")
    assert (state.status, state.attempt_count) == ("running", 3)
    assert [(a.attempt, a.status) for a in store.get_run_history(run_id)] == [
        (1, "scheduled"),
        (3, "running"),
    ]


def test_event_for_unknown_step_is_a_typed_error(store: WorkflowStore) -> None:
    with pytest.raises(StepNotFound):
        store.attempts.record_attempt("missing", 1, "running")


def test_run_completes_only_when_every_step_succeeded(store: WorkflowStore) -> None:
    run_id = store.create_run("canvas", {})
    a = transitions.schedule(store, run_id, "a", data=[])
    b = transitions.schedule(store, run_id, "b", data=[], parent_step_id=a)
    assert store.get_step(b).from_step_name == "a"
    # The last link's success is recorded before its predecessor's: events race.
    store.attempts.record_attempt(b, 1, "succeeded", result=0)
    assert store.attempts.complete_run_if_done(run_id) is False
    assert store.get_run(run_id).status == "running"
    store.attempts.record_attempt(a, 1, "succeeded", result=1)
    assert store.attempts.complete_run_if_done(run_id) is True
    run = store.get_run(run_id)
    assert (run.status, run.output) == ("completed", 0)  # the last step's result, falsy kept


def test_settled_runs_stay_settled(store: WorkflowStore) -> None:
    run_id = store.create_run("canvas", {})
    assert store.attempts.settle_run(run_id, "failed", ValueError("charge failed")) is True
    assert store.attempts.settle_run(run_id, "cancelled") is False
    assert store.attempts.complete_run_if_done(run_id) is False
    run = store.get_run(run_id)
    assert run.status == "failed"
    assert run.error is not None and run.error["message"] == "charge failed"


def test_publishing_a_lone_task_is_one_write_on_postgres(pg_engine: sa.Engine) -> None:
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    step_id = str(uuid.uuid4())
    with count_statements(store.engine) as log:
        transitions.schedule(
            store,
            step_id,
            "charge",
            step_id=step_id,
            rpc_name="shop.charge",
            data={},
            new_run=NewRun("shop.charge", {}),
        )
    assert store.get_step(step_id).step_name == "charge"
    # Run, step and attempt 1 in one statement, which also says the step is there, one COMMIT.
    [write] = [s for s in log.statements if "INSERT" in s]
    assert all(table in write for table in ("workflow_runs", "workflow_step (", "history ("))
    assert (len(log), log.commits) == (1, 1)
    [attempt] = store.get_run_history(step_id)
    assert (attempt.step_name, attempt.status, attempt.reason) == ("charge", "scheduled", "first")


def test_a_redelivery_moves_the_attempts_start_to_its_own_and_nothing_moves_it_back(
    store: WorkflowStore,
) -> None:
    """The attempt row says where and since when its last delivery ran, so what it took is
    the execution that ended it; a late start of a killed delivery, the task that took over
    a replaced attempt, and a delivery after the outcome leave the start where it is."""
    step_id = str(uuid.uuid4())
    t = 1_800_000_000.0

    def apply(*events: Any) -> Any:
        store.batches.apply_batch(plan([Pending(n, e) for n, e in enumerate(events)]))
        [row] = store.get_run_history(step_id)
        return row

    def started(n: int, at: float, *, delivery: bool = True) -> AttemptStarted:
        return AttemptStarted(
            id=f"{step_id}-d{n}",
            at=at,
            step_id=step_id,
            attempt=1,
            worker=f"w{n}",
            pid=n,
            delivery=delivery,
        )

    published = StepPublished(
        id=f"{step_id}-p",
        at=t,
        step_id=step_id,
        run_id=step_id,
        step_name="slow",
        rpc_name="shop.slow",
        data_json='{"args":[],"kwargs":{}}',
        new_run=("shop.slow", "{}", '{"type":"task"}'),
    )
    moment = dt.datetime.fromtimestamp
    row = apply(published, started(1, t + 1))
    assert (row.running_at, row.delivery_count) == (moment(t + 1, dt.timezone.utc), 1)
    row = apply(started(2, t + 5))  # the message came back after its worker died
    assert (row.running_at, row.delivery_count, row.worker) == (
        moment(t + 5, dt.timezone.utc),
        2,
        "w2",
    )
    row = apply(started(1, t + 1), started(3, t + 7, delivery=False))
    assert (row.running_at, row.delivery_count) == (moment(t + 5, dt.timezone.utc), 2)
    succeeded = AttemptSucceeded(
        id=f"{step_id}-s",
        at=t + 15,
        step_id=step_id,
        attempt=1,
        run_id=step_id,
        result_json='"done"',
    )
    row = apply(succeeded)
    assert row.duration == dt.timedelta(seconds=10)
    row = apply(started(4, t + 20))  # delivered again after its outcome: counted only
    assert (row.status, row.delivery_count, row.duration) == (
        "succeeded",
        3,
        dt.timedelta(seconds=10),
    )


def test_two_deliveries_in_one_batch_start_the_attempt_at_the_later(
    store: WorkflowStore,
) -> None:
    step_id = str(uuid.uuid4())
    t = 1_800_000_000.0
    events = [
        StepPublished(
            id=f"{step_id}-p",
            at=t,
            step_id=step_id,
            run_id=step_id,
            step_name="slow",
            rpc_name="shop.slow",
            data_json='{"args":[],"kwargs":{}}',
            new_run=("shop.slow", "{}", '{"type":"task"}'),
        ),
        AttemptStarted(
            id=f"{step_id}-d2", at=t + 5, step_id=step_id, attempt=1, worker="w2", pid=2
        ),
        AttemptStarted(
            id=f"{step_id}-d1", at=t + 1, step_id=step_id, attempt=1, worker="w1", pid=1
        ),
    ]
    store.batches.apply_batch(plan([Pending(n, e) for n, e in enumerate(events)]))
    [row] = store.get_run_history(step_id)
    assert (row.delivery_count, row.running_at, row.worker, row.pid) == (
        2,
        dt.datetime.fromtimestamp(t + 5, dt.timezone.utc),
        "w2",
        2,
    )
