"""The store's contract, run on SQLite and on PostgreSQL alike."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import (
    PayloadTooLarge,
    RunNotFound,
    SerializationError,
    StepNotFound,
    WorkflowStore,
)
from pikku_celery.errors import InvalidStatus, VersionNotFound
from pikku_celery.schema import workflow_runs, workflow_step, workflow_step_history
from pikku_celery.store.mirror_batch import BatchResult
from tests.support import transitions
from tests.support.statements import count_statements


def new_step(store: WorkflowStore, name: str = "charge", **kwargs: Any) -> tuple[str, str]:
    run_id = store.create_run("checkout", {"order": 1})
    step_id = transitions.schedule(
        store, run_id, name, rpc_name="shop.charge", data={"amount": 10}, **kwargs
    )
    return run_id, step_id


def attempt_rows(store: WorkflowStore, step_id: str) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(workflow_step_history)
            .where(workflow_step_history.c.workflow_step_id == step_id)
            .order_by(workflow_step_history.c.attempt)
        ).mappings()
        return [dict(row) for row in rows]


# 1. a published step -------------------------------------------------------------


def test_published_step_writes_step_and_first_attempt(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {"order": 1})
    reserve = transitions.schedule(store, run_id, "reserve")
    step_id = transitions.schedule(
        store,
        run_id,
        "charge",
        rpc_name="shop.charge",
        data={"amount": 10},
        retries=3,
        retry_delay=2,
        parent_step_id=reserve,
    )
    read = store.get_step_state(run_id, "charge")
    assert read.status == "scheduled"
    assert (read.step_id, read.attempt_count, read.retries, read.retry_delay) == (
        step_id,
        1,
        3,
        "2s",
    )
    assert read.from_step_name == "reserve"
    assert read.data == {"amount": 10}
    rows = attempt_rows(store, step_id)
    assert [(row["attempt"], row["status"]) for row in rows] == [(1, "scheduled")]
    assert rows[0]["task_id"] == step_id  # its message is out: only a claim has none


def test_published_step_is_one_transaction(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", None)
    with store.engine.connect() as conn:
        trans = conn.begin()
        transitions.schedule(store, run_id, "charge", conn=conn)
        trans.rollback()
    assert store.list_step_states(run_id) == []
    with store.engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(workflow_step_history))
        assert count.scalar() == 0


# 2. transitions: both rows, atomically, no read of the attempts -----------------

EVENTS: dict[str, Callable[[WorkflowStore, str], BatchResult]] = {
    "dispatched": lambda store, step_id: transitions.dispatch(store, step_id),
    "started": lambda store, step_id: transitions.start(store, step_id),
    "succeeded": lambda store, step_id: transitions.succeed(store, step_id, 1, {"a": 1}),
    "failed": lambda store, step_id: transitions.fail(store, step_id, 1, ValueError("x")),
}


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_transition_writes_both_rows_in_one_transaction_after_one_lookup(
    store: WorkflowStore, event: str
) -> None:
    _, step_id = new_step(store)
    with count_statements(store.engine) as log:
        assert EVENTS[event](store, step_id).missing == frozenset()
    assert log.commits == 1
    # One read first, of the steps the batch names; the attempt rows are never read.
    assert log.verbs()[0] == "SELECT"
    reads = [s for s, verb in zip(log.statements, log.verbs(), strict=True) if verb == "SELECT"]
    assert not [s for s in reads if "workflow_step_history" in s]
    if store.dialect == "sqlite":
        assert len([s for s in log.statements if s.startswith("UPDATE workflow_step SET")]) == 1
        assert len(log.touching("INSERT INTO workflow_step_history")) == 1  # an upsert
    else:
        [both] = log.touching("UPDATE workflow_step SET")  # one round trip for the two rows
        assert "INSERT INTO workflow_step_history" in both


def test_attempt_row_keeps_its_id_across_transitions(store: WorkflowStore) -> None:
    _, step_id = new_step(store)
    [before] = attempt_rows(store, step_id)
    transitions.dispatch(store, step_id)
    transitions.start(store, step_id)
    transitions.succeed(store, step_id, 1, 1)
    [after] = attempt_rows(store, step_id)
    assert after["history_id"] == before["history_id"]
    assert after["status"] == "succeeded"


@pytest.mark.parametrize(
    "first_created",
    [
        # Attempt 1 created after attempt 2: sorting by time would pick it.
        dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc),
        # Both attempts created in the same instant: only current_attempt tells them apart.
        None,
    ],
    ids=["older-attempt-created-later", "same-instant"],
)
def test_an_end_without_an_attempt_number_finds_the_current_attempt(
    store: WorkflowStore, first_created: dt.datetime | None
) -> None:
    run_id, step_id = new_step(store)
    transitions.start(store, step_id)
    transitions.retry(store, step_id, 1, RuntimeError("first"))
    transitions.start(store, step_id, 2)
    same = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with store.engine.begin() as conn:
        update = sa.update(workflow_step_history)
        if first_created is not None:
            update = update.where(workflow_step_history.c.attempt == 1)
        conn.execute(update.values(created_at=first_created or same))
    # Celery's main process reports a failure with no attempt number (a time limit).
    transitions.fail(store, step_id, None, RuntimeError("second"))
    statuses = {row["attempt"]: row["status"] for row in attempt_rows(store, step_id)}
    assert statuses == {1: "failed", 2: "failed"}
    history = store.get_run_history(run_id)
    assert [a.error and a.error["message"] for a in history] == ["first", "second"]


def test_transition_is_atomic(store: WorkflowStore) -> None:
    _, step_id = new_step(store)
    with store.engine.connect() as conn:
        trans = conn.begin()
        transitions.start(store, step_id, conn=conn)
        trans.rollback()
    [row] = attempt_rows(store, step_id)
    assert row["status"] == "scheduled"
    assert row["running_at"] is None
    assert row["delivery_count"] == 0


def test_transition_of_unknown_step_is_reported_missing_and_writes_nothing(
    store: WorkflowStore,
) -> None:
    # Its publish may still be on its way: the mirror keeps the event and tries again.
    step_id = str(uuid.uuid4())
    assert transitions.start(store, step_id).missing == {step_id}
    assert transitions.succeed(store, step_id, 1, "done").missing == {step_id}
    assert attempt_rows(store, step_id) == []


def test_duplicate_and_late_events_change_nothing(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)

    def seen() -> tuple[Any, ...]:
        state = store.get_step_state(run_id, "charge")
        [attempt] = store.get_run_history(run_id)
        return (
            (state.status, state.result, state.error, state.attempt_count),
            (attempt.status, attempt.result, attempt.error, attempt.succeeded_at),
            store.get_run(run_id).status,
        )

    transitions.start(store, step_id)
    transitions.succeed(store, step_id, 1, "done")
    done = seen()
    assert done[2] == "completed"
    transitions.succeed(store, step_id, 1, "again")
    assert seen() == done
    transitions.start(store, step_id)  # late (or a redelivery): never rewinds
    assert seen() == done
    transitions.fail(store, step_id, 1, ValueError("late"))
    assert seen() == done
    state = store.get_step_state(run_id, "charge")
    assert (state.status, state.result, state.error) == ("succeeded", "done", None)
    [attempt] = store.get_run_history(run_id)
    assert (attempt.status, attempt.result) == ("succeeded", "done")


# 3. timestamps, results, errors -------------------------------------------------


def test_each_transition_stamps_its_own_time(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)  # published: scheduled_at
    transitions.start(store, step_id)
    transitions.succeed(store, step_id, 1, {"paid": True})
    [attempt] = store.get_run_history(run_id)
    assert attempt.scheduled_at is not None
    assert attempt.running_at is not None
    assert attempt.succeeded_at is not None
    assert attempt.failed_at is None
    assert attempt.scheduled_at <= attempt.running_at <= attempt.succeeded_at
    assert attempt.succeeded_at.tzinfo is not None
    assert attempt.duration is not None and attempt.duration >= dt.timedelta(0)


def test_success_clears_error_and_failure_clears_result(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    transitions.start(store, step_id)
    transitions.fail(store, step_id, 1, ValueError("card declined"))
    failed = store.get_step_state(run_id, "charge")
    assert failed.result is None
    assert failed.error is not None
    assert failed.error["type"] == "ValueError"
    assert failed.error["message"] == "card declined"
    store.attempts.create_retry_attempt(step_id, "running")
    transitions.succeed(store, step_id, 2, {"paid": True})
    done = store.get_step_state(run_id, "charge")
    assert (done.status, done.result, done.error) == ("succeeded", {"paid": True}, None)


def test_error_is_stored_with_type_message_traceback_and_stack(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    try:
        raise KeyError("sku-9")
    except KeyError as exc:
        transitions.fail(store, step_id, 1, exc)
    [attempt] = store.get_run_history(run_id)
    assert attempt.error is not None
    assert set(attempt.error) == {"type", "message", "traceback", "stack"}
    assert attempt.error["type"] == "KeyError"
    assert "sku-9" in attempt.error["message"]
    assert "Traceback" in attempt.error["traceback"]
    # A Pikku reader finds the traceback under the name it reads.
    assert attempt.error["stack"] == attempt.error["traceback"]
    assert attempt.failed_at is not None


# 5. create_retry_attempt ---------------------------------------------------------


def test_retry_attempt_moves_step_and_adds_row_atomically(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    transitions.fail(store, step_id, 1, ValueError("first"))
    state = store.attempts.create_retry_attempt(step_id, "running")
    assert state.attempt_count == 2
    assert state.status == "running"
    assert (state.result, state.error) == (None, None)
    assert store.get_step_state(run_id, "charge").attempt_count == 2
    rows = attempt_rows(store, step_id)
    assert [(r["attempt"], r["status"]) for r in rows] == [(1, "failed"), (2, "running")]
    assert rows[1]["running_at"] is not None

    with store.engine.connect() as conn:
        trans = conn.begin()
        store.attempts.create_retry_attempt(step_id, "pending", conn=conn)
        trans.rollback()
    assert store.get_step_state(run_id, "charge").attempt_count == 2
    assert len(attempt_rows(store, step_id)) == 2


def test_retry_attempt_of_unknown_step_is_a_typed_error(store: WorkflowStore) -> None:
    with pytest.raises(StepNotFound):
        store.attempts.create_retry_attempt("missing", "pending")
    _, step_id = new_step(store)
    with pytest.raises(InvalidStatus):
        store.attempts.create_retry_attempt(step_id, "succeeded")  # type: ignore[arg-type]


# 6. legacy rows without current_attempt -----------------------------------------


def test_step_without_current_attempt_is_repaired(store: WorkflowStore) -> None:
    run_id = store.create_run("legacy", {})
    step_id = str(uuid.uuid4())
    now = dt.datetime.now(dt.timezone.utc)
    with store.engine.begin() as conn:  # as an older writer left it: no attempt anywhere
        conn.execute(
            sa.insert(workflow_step).values(
                workflow_step_id=step_id,
                workflow_run_id=run_id,
                step_name="old",
                status="pending",
                current_attempt=None,
                created_at=now,
                updated_at=now,
                # Its run's day, which the partitioned layout's conversion gives every row.
                run_day=sa.select(workflow_runs.c.run_day)
                .where(workflow_runs.c.workflow_run_id == run_id)
                .scalar_subquery(),
            )
        )
    assert store.get_step_state(run_id, "old").attempt_count == 1
    transitions.start(store, step_id)
    transitions.succeed(store, step_id, 1, 42)
    rows = attempt_rows(store, step_id)
    assert [(r["attempt"], r["status"], r["result"]) for r in rows] == [(1, "succeeded", 42)]
    assert rows[0]["running_at"] is not None
    with store.engine.connect() as conn:
        current = conn.execute(
            sa.select(workflow_step.c.current_attempt).where(
                workflow_step.c.workflow_step_id == step_id
            )
        ).scalar()
    assert current == 1


# 7. reads ------------------------------------------------------------------------


def test_get_step_state_is_one_query_without_history(store: WorkflowStore) -> None:
    run_id, _ = new_step(store)
    with count_statements(store.engine) as log:
        state = store.get_step_state(run_id, "charge")
    assert state.step_name == "charge"
    assert len(log) == 1
    assert log.touching("workflow_step_history") == []


def test_get_step_state_of_missing_step_is_a_typed_error(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {})
    with pytest.raises(StepNotFound, match=f"pikku-celery runs show {run_id}"):
        store.get_step_state(run_id, "nope")


def test_list_step_states_is_one_query(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {})
    for name in ["a", "b", "c"]:
        transitions.schedule(store, run_id, name)
    with count_statements(store.engine) as log:
        states = store.list_step_states(run_id)
    assert [s.step_name for s in states] == ["a", "b", "c"]
    assert len(log) == 1
    assert store.list_step_states("unknown") == []


def test_run_history_lists_every_attempt_in_order(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {})
    first = transitions.schedule(store, run_id, "reserve")
    second = transitions.schedule(store, run_id, "charge", parent_step_id=first)
    transitions.succeed(store, first, 1, "r")
    transitions.retry(store, second, 1, ValueError("1"))
    transitions.retry(store, second, 2, ValueError("2"))
    transitions.succeed(store, second, 3, "c")
    history = store.get_run_history(run_id)
    assert [(a.step_name, a.attempt, a.status) for a in history] == [
        ("reserve", 1, "succeeded"),
        ("charge", 1, "failed"),
        ("charge", 2, "failed"),
        ("charge", 3, "succeeded"),
    ]
    assert history[1].from_step_name == "reserve"
    assert history[2].error is not None and history[2].error["message"] == "2"
    assert store.get_run_history("unknown") == []


# 8. run state --------------------------------------------------------------------


def test_run_state_is_one_statement_without_read(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {})
    with count_statements(store.engine) as log:
        store.update_run_state(run_id, "receipt", {"id": 7})
    assert log.verbs() == ["UPDATE"]
    assert store.get_run_state(run_id) == {"receipt": {"id": 7}}


@pytest.mark.parametrize(
    "value", [[], 0, False, None, "", {"nested": {"list": [1, "two", None, {"x": 1.5}]}}, -1.25]
)
def test_run_state_json_types_survive(store: WorkflowStore, value: Any) -> None:
    run_id = store.create_run("checkout", {})
    store.update_run_state(run_id, "k", value)
    state = store.get_run_state(run_id)
    assert state == {"k": value}
    assert type(state["k"]) is type(value)


@pytest.mark.parametrize(
    "key",
    [
        "a.b",
        'it"s',
        "back\\slash",
        "ü",
        "\\u00fc",
        "$.x",
        "[0]",
        "a'b",
        "日本語.键",
        "",
        " ",
        "' OR 1=1; DROP TABLE workflow_runs; --",
        '"); DROP TABLE x; --',
        "x" * 5000,
    ],
)
def test_run_state_key_is_one_literal_key(store: WorkflowStore, key: str) -> None:
    run_id = store.create_run("checkout", {})
    store.update_run_state(run_id, "other", 1)
    store.update_run_state(run_id, key, "first")
    store.update_run_state(run_id, key, {"second": True})
    assert store.get_run_state(run_id) == {"other": 1, key: {"second": True}}
    assert len(store.list_runs()) == 1


def test_run_state_key_is_replaced(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {})
    store.update_run_state(run_id, "k", {"a": 1, "b": 2})
    store.update_run_state(run_id, "k", {"c": 3})
    store.update_run_state(run_id, "k2", None)
    assert store.get_run_state(run_id) == {"k": {"c": 3}, "k2": None}


def test_run_state_of_unknown_run_is_a_typed_error(store: WorkflowStore) -> None:
    with pytest.raises(RunNotFound):
        store.update_run_state("missing", "k", 1)
    with pytest.raises(RunNotFound):
        store.get_run_state("missing")


# 9. run status and outputs -------------------------------------------------------


@pytest.mark.parametrize("output", [0, "", False, [], {}, None])
def test_falsy_output_is_stored_as_itself(store: WorkflowStore, output: Any) -> None:
    run_id = store.create_run("checkout", {})
    store.runs.update_run_status(run_id, "completed", output=output)
    run = store.get_run(run_id)
    assert run.status == "completed"
    assert run.output == output
    assert type(run.output) is type(output)


def test_run_status_error_and_validation(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {"x": 1}, graph_hash="abc", wire={"type": "celery"})
    run = store.get_run(run_id)
    assert (run.workflow, run.status, run.input, run.graph_hash, run.wire) == (
        "checkout",
        "running",
        {"x": 1},
        "abc",
        {"type": "celery"},
    )
    assert (run.state, run.inline, run.deterministic) == ({}, False, False)
    store.runs.update_run_status(run_id, "failed", error=ValueError("step charge failed"))
    failed = store.get_run(run_id)
    assert failed.error is not None and failed.error["message"] == "step charge failed"
    with pytest.raises(InvalidStatus, match="completed"):
        store.runs.update_run_status(run_id, "done")
    with pytest.raises(RunNotFound):
        store.runs.update_run_status("missing", "completed")
    assert store.get_run(run_id).status == "failed"


def test_list_runs_filters_and_pages_newest_first(store: WorkflowStore) -> None:
    ids = [store.create_run("checkout" if i % 2 else "refund", {"i": i}) for i in range(6)]
    store.runs.update_run_status(ids[1], "completed")
    newest_first = [run.run_id for run in store.list_runs()]
    assert newest_first == ids[::-1]
    assert [r.run_id for r in store.list_runs(limit=2, offset=2)] == ids[::-1][2:4]
    assert [r.run_id for r in store.list_runs(workflow="checkout")] == [ids[5], ids[3], ids[1]]
    assert [r.run_id for r in store.list_runs(status="completed")] == [ids[1]]
    assert [r.run_id for r in store.list_runs(workflow="refund", status=["running"])] == [
        ids[4],
        ids[2],
        ids[0],
    ]
    with pytest.raises(ValueError, match="limit"):
        store.list_runs(limit=0)


def test_delete_run_takes_steps_and_attempts_with_it(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    store.attempts.create_retry_attempt(step_id, "running")
    keep_run, _ = new_step(store)
    assert store.delete_run(run_id) is True
    assert store.delete_run(run_id) is False
    with pytest.raises(RunNotFound):
        store.get_run(run_id)
    with store.engine.connect() as conn:
        steps_left = conn.execute(sa.select(workflow_step.c.workflow_run_id)).scalars().all()
        attempts_left = conn.execute(
            sa.select(sa.func.count()).select_from(workflow_step_history)
        ).scalar()
    assert steps_left == [keep_run]
    assert attempts_left == 1


# 10. JSON only, typed errors, nothing half-written -----------------------------


class NotJson:
    pass


@pytest.mark.parametrize(
    "bad", [NotJson(), {1, 2}, math.nan, math.inf, {"a": -math.inf}, b"bytes", "\ud800"]
)
def test_unserialisable_result_is_refused_before_writing(store: WorkflowStore, bad: Any) -> None:
    run_id, step_id = new_step(store)
    transitions.start(store, step_id)
    # The store's codec refuses it while the batch is made (the mirror then stores a
    # marked placeholder instead: see test_mirror), before any statement is sent.
    with count_statements(store.engine) as log, pytest.raises(SerializationError, match="JSON"):
        transitions.succeed(store, step_id, 1, bad)
    assert len(log) == 0
    state = store.get_step_state(run_id, "charge")
    assert (state.status, state.result) == ("running", None)


def test_unserialisable_input_creates_nothing(store: WorkflowStore) -> None:
    with pytest.raises(SerializationError):
        store.create_run("checkout", NotJson())
    assert store.list_runs() == []
    run_id = store.create_run("checkout", {})
    with pytest.raises(SerializationError):
        transitions.schedule(store, run_id, "charge", data={"when": dt.datetime.now()})
    assert store.list_step_states(run_id) == []
    with pytest.raises(SerializationError):
        store.update_run_state(run_id, "k", NotJson())
    assert store.get_run_state(run_id) == {}


def test_oversized_payload_is_refused(store: WorkflowStore) -> None:
    small = WorkflowStore(store.engine, max_payload_bytes=1024)
    run_id, step_id = new_step(small)
    with pytest.raises(PayloadTooLarge, match="reference"):
        transitions.succeed(small, step_id, 1, "x" * 2000)
    assert small.get_step_state(run_id, "charge").status == "scheduled"


def test_nul_in_strings_round_trips_or_is_refused(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    if store.dialect == "postgresql":
        with pytest.raises(SerializationError, match="NUL"):
            transitions.succeed(store, step_id, 1, "a\x00b")
        assert store.get_step_state(run_id, "charge").result is None
    else:
        transitions.succeed(store, step_id, 1, "a\x00b")
        assert store.get_step_state(run_id, "charge").result == "a\x00b"
    # An escaped backslash before u0000 is not a NUL.
    store2_run, step2 = new_step(store, "literal")
    transitions.succeed(store, step2, 1, "\\u0000")
    assert store.get_step_state(store2_run, "literal").result == "\\u0000"


def test_large_and_deep_values_round_trip(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    deep: Any = "leaf"
    for _ in range(200):
        deep = {"d": [deep]}
    big = {"blob": "é" * 2_000_000, "deep": deep, "float": 1.5e-10, "neg": -123.25, "int": 2**62}
    transitions.succeed(store, step_id, 1, big)
    assert store.get_step_state(run_id, "charge").result == big


# Versions ------------------------------------------------------------------------


def test_workflow_versions_first_writer_wins(store: WorkflowStore) -> None:
    assert (
        store.versions.upsert_workflow_version("checkout", "h1", {"steps": ["a"]}, "complex")
        is True
    )
    assert (
        store.versions.upsert_workflow_version("checkout", "h1", {"steps": ["b"]}, "complex")
        is False
    )
    version = store.get_workflow_version("checkout", "h1")
    assert version is not None
    assert (version.graph, version.source, version.status) == (
        {"steps": ["a"]},
        "complex",
        "active",
    )
    assert store.get_workflow_version("checkout", "h2") is None
    store.versions.update_workflow_version_status("checkout", "h1", "declined")
    declined = store.get_workflow_version("checkout", "h1")
    assert declined is not None and declined.status == "declined"
    with pytest.raises(VersionNotFound):
        store.versions.update_workflow_version_status("checkout", "h2", "active")
    with pytest.raises(InvalidStatus):
        store.versions.update_workflow_version_status("checkout", "h1", "gone")


def test_run_id_can_be_given(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {}, run_id="celery-root-id")
    assert run_id == "celery-root-id"
    assert store.get_run("celery-root-id").workflow == "checkout"
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(workflow_runs.c.workflow_run_id)).scalar() == run_id
