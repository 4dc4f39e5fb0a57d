"""The store's contract, run on SQLite and on PostgreSQL alike."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import (
    PayloadTooLarge,
    RunNotFound,
    SerializationError,
    StepAlreadyExists,
    StepNotFound,
    WorkflowStore,
)
from pikku_celery.errors import InvalidStatus, VersionNotFound
from pikku_celery.schema import workflow_runs, workflow_step, workflow_step_history
from tests.conftest import truncate
from tests.support.statements import count_statements


def new_step(store: WorkflowStore, name: str = "charge", **kwargs: Any) -> tuple[str, str]:
    run_id = store.create_run("checkout", {"order": 1})
    step = store.insert_step_state(run_id, name, "shop.charge", {"amount": 10}, **kwargs)
    return run_id, step.step_id


def attempt_rows(store: WorkflowStore, step_id: str) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(workflow_step_history)
            .where(workflow_step_history.c.workflow_step_id == step_id)
            .order_by(workflow_step_history.c.attempt)
        ).mappings()
        return [dict(row) for row in rows]


# 1. insert_step_state ----------------------------------------------------------


def test_insert_step_writes_step_and_first_attempt(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {"order": 1})
    state = store.insert_step_state(
        run_id,
        "charge",
        "shop.charge",
        {"amount": 10},
        retries=3,
        retry_delay=2,
        from_step_name="reserve",
    )
    assert state.attempt_count == 1
    assert state.status == "pending"
    read = store.get_step_state(run_id, "charge")
    assert (read.step_id, read.attempt_count, read.retries, read.retry_delay) == (
        state.step_id,
        1,
        3,
        "2s",
    )
    assert read.from_step_name == "reserve"
    assert read.data == {"amount": 10}
    rows = attempt_rows(store, state.step_id)
    assert [(row["attempt"], row["status"]) for row in rows] == [(1, "pending")]


def test_insert_step_is_one_transaction(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", None)
    with store.engine.connect() as conn:
        trans = conn.begin()
        store.insert_step_state(run_id, "charge", None, None, conn=conn)
        trans.rollback()
    assert store.list_step_states(run_id) == []
    with store.engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(workflow_step_history))
        assert count.scalar() == 0


def test_insert_step_can_start_scheduled(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", None)
    state = store.insert_step_state(run_id, "charge", None, None, status="scheduled")
    [attempt] = store.get_run_history(run_id)
    assert state.status == attempt.status == "scheduled"
    assert attempt.scheduled_at is not None


def test_duplicate_step_name_is_a_typed_error(store: WorkflowStore) -> None:
    run_id, _ = new_step(store)
    with pytest.raises(StepAlreadyExists, match="charge"):
        store.insert_step_state(run_id, "charge", None, None)
    assert len(store.list_step_states(run_id)) == 1


def test_step_of_unknown_run_is_a_typed_error(store: WorkflowStore) -> None:
    with pytest.raises(RunNotFound):
        store.insert_step_state("no-such-run", "charge", None, None)


# 2. transitions: both rows, atomically, no read ---------------------------------


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("set_step_scheduled", ()),
        ("set_step_running", ()),
        ("set_step_result", ({"a": 1},)),
        ("set_step_error", (ValueError("x"),)),
    ],
)
def test_transition_writes_two_rows_and_reads_none(
    store: WorkflowStore, method: str, args: tuple[Any, ...]
) -> None:
    _, step_id = new_step(store)
    with count_statements(store.engine) as log:
        assert getattr(store, method)(step_id, *args) is True
    assert "SELECT" not in [verb for verb in log.verbs() if verb != "WITH"]
    if store.dialect == "sqlite":
        assert log.verbs() == ["UPDATE", "UPDATE"]
        assert "workflow_step " in log.statements[0] or "workflow_step SET" in log.statements[0]
        assert "workflow_step_history" in log.statements[1]
    else:
        assert len(log) == 1, log.statements  # one round trip
        assert "workflow_step_history" in log.statements[0]
        assert "UPDATE workflow_step" in log.statements[0]


def test_transition_is_one_round_trip_on_postgres(pg_engine: sa.Engine) -> None:
    # SQLite has no round trips; its two statements share one transaction.
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    _, step_id = new_step(store)
    autocommit: list[bool] = []

    def record(conn: Any, *_: Any) -> None:
        autocommit.append(bool(conn.connection.dbapi_connection.autocommit))

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        store.set_step_running(step_id)
        store.get_step_state(store.get_step(step_id).run_id, "charge")
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    # One statement in autocommit: no BEGIN and COMMIT round trips around it.
    assert autocommit == [True, True, True]


def test_attempt_row_keeps_its_id_across_transitions(store: WorkflowStore) -> None:
    _, step_id = new_step(store)
    [before] = attempt_rows(store, step_id)
    store.set_step_scheduled(step_id)
    store.set_step_running(step_id)
    store.set_step_result(step_id, 1)
    [after] = attempt_rows(store, step_id)
    assert after["history_id"] == before["history_id"]
    assert after["status"] == "succeeded"


def test_transition_finds_attempt_through_current_attempt(store: WorkflowStore) -> None:
    _, step_id = new_step(store)
    store.set_step_error(step_id, RuntimeError("first"))
    store.attempts.create_retry_attempt(step_id, "pending")
    # Give attempt 1 a later creation time than attempt 2: sorting by time would pick it.
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(workflow_step_history)
            .where(workflow_step_history.c.attempt == 1)
            .values(created_at=dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc))
        )
    store.set_step_running(step_id)
    statuses = {row["attempt"]: row["status"] for row in attempt_rows(store, step_id)}
    assert statuses == {1: "failed", 2: "running"}


def test_transition_is_atomic(store: WorkflowStore) -> None:
    _, step_id = new_step(store)
    with store.engine.connect() as conn:
        trans = conn.begin()
        store.set_step_running(step_id, conn=conn)
        trans.rollback()
    [row] = attempt_rows(store, step_id)
    assert row["status"] == "pending"
    assert row["running_at"] is None


def test_transition_of_unknown_step_is_a_typed_error(store: WorkflowStore) -> None:
    with pytest.raises(StepNotFound):
        store.set_step_running(str(uuid.uuid4()))


def test_duplicate_and_late_events_change_nothing(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    store.set_step_running(step_id)
    assert store.set_step_result(step_id, "done") is True
    assert store.set_step_result(step_id, "again") is False
    assert store.set_step_running(step_id) is False  # late: never rewinds
    assert store.set_step_error(step_id, ValueError("late")) is False
    state = store.get_step_state(run_id, "charge")
    assert (state.status, state.result, state.error) == ("succeeded", "done", None)
    [attempt] = store.get_run_history(run_id)
    assert (attempt.status, attempt.result) == ("succeeded", "done")


# 3. timestamps, results, errors -------------------------------------------------


def test_each_transition_stamps_its_own_time(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    store.set_step_scheduled(step_id)
    store.set_step_running(step_id)
    store.set_step_result(step_id, {"paid": True})
    [attempt] = store.get_run_history(run_id)
    assert attempt.scheduled_at is not None
    assert attempt.running_at is not None
    assert attempt.succeeded_at is not None
    assert attempt.failed_at is None
    assert attempt.scheduled_at <= attempt.running_at <= attempt.succeeded_at
    assert attempt.succeeded_at.tzinfo is not None
    assert attempt.duration is not None and attempt.duration >= dt.timedelta(0)


def test_scheduled_is_recorded_on_the_attempt(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    store.set_step_scheduled(step_id)
    [attempt] = store.get_run_history(run_id)
    assert attempt.status == "scheduled"
    assert store.get_step_state(run_id, "charge").status == "scheduled"


def test_success_clears_error_and_failure_clears_result(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    store.set_step_running(step_id)
    store.set_step_error(step_id, ValueError("card declined"))
    failed = store.get_step_state(run_id, "charge")
    assert failed.result is None
    assert failed.error is not None
    assert failed.error["type"] == "ValueError"
    assert failed.error["message"] == "card declined"
    store.attempts.create_retry_attempt(step_id, "running")
    store.set_step_result(step_id, {"paid": True})
    done = store.get_step_state(run_id, "charge")
    assert (done.status, done.result, done.error) == ("succeeded", {"paid": True}, None)


def test_error_is_stored_with_type_message_traceback_and_stack(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    try:
        raise KeyError("sku-9")
    except KeyError as exc:
        store.set_step_error(step_id, exc)
    [attempt] = store.get_run_history(run_id)
    assert attempt.error is not None
    assert set(attempt.error) == {"type", "message", "traceback", "stack"}
    assert attempt.error["type"] == "KeyError"
    assert "sku-9" in attempt.error["message"]
    assert "Traceback" in attempt.error["traceback"]
    # A Pikku reader finds the traceback under the name it reads.
    assert attempt.error["stack"] == attempt.error["traceback"]
    assert attempt.failed_at is not None


# 4. same-millisecond retry -------------------------------------------------------


def test_retry_in_the_same_millisecond_resolves_the_new_attempt(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    store.set_step_running(step_id)
    store.set_step_error(step_id, ValueError("first"))
    store.attempts.create_retry_attempt(step_id, "running")
    # Put both attempts in the same instant: only current_attempt tells them apart.
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(workflow_step_history).values(
                created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
            )
        )
    store.set_step_result(step_id, "ok")
    history = store.get_run_history(run_id)
    assert [(a.attempt, a.status) for a in history] == [(1, "failed"), (2, "succeeded")]


# 5. create_retry_attempt ---------------------------------------------------------


def test_retry_attempt_moves_step_and_adds_row_atomically(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    store.set_step_error(step_id, ValueError("first"))
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
            )
        )
    assert store.get_step_state(run_id, "old").attempt_count == 1
    store.set_step_running(step_id)
    store.set_step_result(step_id, 42)
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
    with pytest.raises(StepNotFound, match="insert_step_state"):
        store.get_step_state(run_id, "nope")


def test_list_step_states_is_one_query(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {})
    for name in ["a", "b", "c"]:
        store.insert_step_state(run_id, name, None, None)
    with count_statements(store.engine) as log:
        states = store.list_step_states(run_id)
    assert [s.step_name for s in states] == ["a", "b", "c"]
    assert len(log) == 1
    assert store.list_step_states("unknown") == []


def test_run_history_lists_every_attempt_in_order(store: WorkflowStore) -> None:
    run_id = store.create_run("checkout", {})
    first = store.insert_step_state(run_id, "reserve", None, None)
    second = store.insert_step_state(run_id, "charge", None, None, from_step_name="reserve")
    store.set_step_result(first.step_id, "r")
    store.set_step_error(second.step_id, ValueError("1"))
    store.attempts.create_retry_attempt(second.step_id, "running")
    store.set_step_error(second.step_id, ValueError("2"))
    store.attempts.create_retry_attempt(second.step_id, "running")
    store.set_step_result(second.step_id, "c")
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
    store.set_step_running(step_id)
    with count_statements(store.engine) as log, pytest.raises(SerializationError, match="JSON"):
        store.set_step_result(step_id, bad)
    assert len(log) == 0
    state = store.get_step_state(run_id, "charge")
    assert (state.status, state.result) == ("running", None)


def test_unserialisable_input_creates_nothing(store: WorkflowStore) -> None:
    with pytest.raises(SerializationError):
        store.create_run("checkout", NotJson())
    assert store.list_runs() == []
    run_id = store.create_run("checkout", {})
    with pytest.raises(SerializationError):
        store.insert_step_state(run_id, "charge", None, {"when": dt.datetime.now()})
    assert store.list_step_states(run_id) == []
    with pytest.raises(SerializationError):
        store.update_run_state(run_id, "k", NotJson())
    assert store.get_run_state(run_id) == {}


def test_oversized_payload_is_refused(store: WorkflowStore) -> None:
    small = WorkflowStore(store.engine, max_payload_bytes=1024)
    run_id, step_id = new_step(small)
    with pytest.raises(PayloadTooLarge, match="reference"):
        small.set_step_result(step_id, "x" * 2000)
    assert small.get_step_state(run_id, "charge").status == "pending"


def test_nul_in_strings_round_trips_or_is_refused(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    if store.dialect == "postgresql":
        with pytest.raises(SerializationError, match="NUL"):
            store.set_step_result(step_id, "a\x00b")
        assert store.get_step_state(run_id, "charge").result is None
    else:
        store.set_step_result(step_id, "a\x00b")
        assert store.get_step_state(run_id, "charge").result == "a\x00b"
    # An escaped backslash before u0000 is not a NUL.
    store2_run, step2 = new_step(store, "literal")
    store.set_step_result(step2, "\\u0000")
    assert store.get_step_state(store2_run, "literal").result == "\\u0000"


def test_large_and_deep_values_round_trip(store: WorkflowStore) -> None:
    run_id, step_id = new_step(store)
    deep: Any = "leaf"
    for _ in range(200):
        deep = {"d": [deep]}
    big = {"blob": "é" * 2_000_000, "deep": deep, "float": 1.5e-10, "neg": -123.25, "int": 2**62}
    store.set_step_result(step_id, big)
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
