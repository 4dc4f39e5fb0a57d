"""The data contract (docs/data-contract.md), checked the way another system's reader sees it.

Rows written by every path of the store (single writes, attempt writes, the
mirror's batches) are read back here with plain SQL, never through the store:
timestamp text, boolean forms, duration strings, error keys, and on
PostgreSQL the ``pikku_compat`` views. Then rows written in Pikku's own forms
are read through the store and the command line.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any, Final

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.cli import commands as cli
from pikku_celery.cli import common as codes
from pikku_celery.errors import InvalidDuration
from pikku_celery.mirror.apply import Pending, plan
from pikku_celery.mirror.events import AttemptRetried, AttemptStarted, StepPublished
from pikku_celery.schema import COMPAT_SCHEMA
from pikku_celery.store.mirror_batch import MirrorBatch, NewStep, StepTransition
from tests.conftest import truncate
from tests.support import transitions
from tests.support.foreign import PIKKU_ERROR, insert_foreign_run

UTC = dt.timezone.utc
ISO_UTC: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
DURATION: Final = re.compile(r"\d+(ms|s)")

TIME_COLUMNS: Final = {
    "workflow_runs": ("created_at", "updated_at"),
    "workflow_step": ("created_at", "updated_at"),
    "workflow_step_history": (
        "created_at",
        "running_at",
        "scheduled_at",
        "succeeded_at",
        "failed_at",
        "eta",
    ),
    "workflow_versions": ("created_at",),
}
JSON_COLUMNS: Final = {
    "workflow_runs": {"input", "output", "error", "state", "planned_steps", "wire"},
    "workflow_step": {"data", "result", "error", "routing"},
    "workflow_step_history": {"result", "error"},
    "workflow_versions": {"graph"},
}


class CodedError(Exception):
    code = "PAYMENT_DECLINED"


def raised(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as caught:
        return caught


def rows(store: WorkflowStore, sql: str, **params: Any) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        return [dict(row) for row in conn.execute(sa.text(sql), params).mappings()]


def write_every_way(store: WorkflowStore) -> dict[str, str]:
    """A run, steps and attempts through each write path of the store; their ids."""
    now = dt.datetime.now(UTC)
    run_id = store.create_run(
        "checkout", {"order": 1}, inline=True, deterministic=False, wire={"type": "workflow"}
    )
    store.update_run_state(run_id, "receipt_id", "r-1")
    single = transitions.schedule(
        store, run_id, "reserve", rpc_name="shop.reserve", data={}, retry_delay=0.2
    )
    transitions.start(store, single)
    transitions.fail(store, single, 1, raised(CodedError("card declined")))
    store.attempts.create_retry_attempt(single, "running")
    transitions.succeed(store, single, 2, "reserved")

    scheduled = transitions.schedule(
        store,
        run_id,
        "charge",
        rpc_name="shop.charge",
        data={},
        retry_delay=180,
        eta=now + dt.timedelta(seconds=5),
    )
    store.attempts.record_attempt(scheduled, 1, "running", worker="w1@host", pid=7)
    store.attempts.record_attempt(scheduled, 1, "failed", error=raised(ValueError("gateway")))

    lone_run, lone_step = str(uuid.uuid4()), str(uuid.uuid4())
    store.batches.apply_batch(
        MirrorBatch(
            steps=[
                NewStep(
                    run_id=lone_run,
                    step_id=lone_step,
                    step_name="shop.ship",
                    rpc_name="shop.ship",
                    data_json="{}",
                    at=now,
                    retry_delay=0.5,  # seconds
                    eta=now,
                    run_workflow="shop.ship",
                    run_input_json="{}",
                )
            ],
            transitions=[
                StepTransition(
                    step_id=lone_step,
                    attempt=1,
                    status="succeeded",
                    at=now,
                    running_at=now,
                    ended_at=now,
                    result_json='"shipped"',
                    worker="w2@host",
                    delivery_ids=(str(uuid.uuid4()),),
                )
            ],
        )
    )
    store.runs.update_run_status(run_id, "failed", error=raised(CodedError("declined")))
    store.versions.upsert_workflow_version("checkout", "h1", {"nodes": []}, "complex")
    return {"run": run_id, "lone_run": lone_run, "single": single, "lone": lone_step}


# --- what pikku-celery writes, read with plain SQL ---------------------------------


def test_every_time_written_is_iso_8601_utc_with_its_zone(store: WorkflowStore) -> None:
    write_every_way(store)
    for table, columns in TIME_COLUMNS.items():
        for column in columns:
            found = rows(store, f"SELECT {column} AS t FROM {table} WHERE {column} IS NOT NULL")
            assert found, (table, column)
            for row in found:
                value = row["t"]
                if store.dialect == "sqlite":
                    assert isinstance(value, str) and ISO_UTC.fullmatch(value), (table, value)
                else:
                    # timestamptz: a foreign driver gets the instant, not a local reading.
                    assert isinstance(value, dt.datetime) and value.utcoffset() is not None


def test_sqlite_time_text_sorts_as_time_and_reads_back_as_written(store: WorkflowStore) -> None:
    ids = write_every_way(store)
    run = store.get_run(ids["run"])
    [row] = rows(
        store,
        "SELECT created_at, updated_at FROM workflow_runs WHERE workflow_run_id = :r",
        r=ids["run"],
    )
    if store.dialect == "sqlite":
        assert row["created_at"] == run.created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert row["created_at"] <= row["updated_at"]
    else:
        assert row["created_at"] == run.created_at


def test_booleans_are_written_in_one_form(store: WorkflowStore) -> None:
    ids = write_every_way(store)
    if store.dialect == "sqlite":
        found = rows(
            store,
            "SELECT workflow_run_id AS id, inline, typeof(inline) AS kind, deterministic, "
            "typeof(deterministic) AS dkind FROM workflow_runs",
        )
        # Lone tasks' runs come from the mirror's batches: the same form.
        assert {row["id"] for row in found} == {ids["run"], ids["lone_run"]}
        for row in found:
            assert (row["kind"], row["dkind"]) == ("text", "text")
            assert row["deterministic"] == "false"
            assert row["inline"] == ("true" if row["id"] == ids["run"] else "false")
    else:
        [kind] = rows(
            store,
            "SELECT data_type FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = 'workflow_runs' AND column_name = 'inline'",
        )
        assert kind["data_type"] == "boolean"
        [row] = rows(
            store, "SELECT inline FROM workflow_runs WHERE workflow_run_id = :r", r=ids["run"]
        )
        assert row["inline"] is True


def test_retry_delays_are_duration_strings_with_a_unit(store: WorkflowStore) -> None:
    ids = write_every_way(store)
    found = {
        row["workflow_step_id"]: row["retry_delay"]
        for row in rows(store, "SELECT workflow_step_id, retry_delay FROM workflow_step")
    }
    assert found[ids["single"]] == "200ms"
    assert found[ids["lone"]] == "500ms"
    assert "180s" in found.values()
    for value in found.values():
        assert DURATION.fullmatch(value), value


@pytest.mark.parametrize(
    ("given", "stored", "seconds"),
    [
        (2, "2s", 2.0),
        (0, "0s", 0.0),
        (0.25, "250ms", 0.25),
        (dt.timedelta(minutes=2), "120s", 120.0),
        ("2min", "120s", 120.0),
        ("1500ms", "1500ms", 1.5),
        ("1h", "3600s", 3600.0),
        ("180", "180s", 180.0),
    ],
)
def test_a_retry_delay_is_stored_as_pikku_reads_it(
    store: WorkflowStore, given: Any, stored: str, seconds: float
) -> None:
    run_id = store.create_run("checkout", {})
    transitions.schedule(store, run_id, "a", retry_delay=given)
    [row] = rows(
        store, "SELECT retry_delay FROM workflow_step WHERE workflow_run_id = :r", r=run_id
    )
    assert row["retry_delay"] == stored
    read = store.get_step_state(run_id, "a")
    assert (read.retry_delay, read.retry_delay_seconds) == (stored, seconds)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "exponential", "1.5s", True])
def test_a_delay_that_is_no_duration_is_refused_before_anything_is_written(
    store: WorkflowStore, bad: Any
) -> None:
    run_id = store.create_run("checkout", {})
    # Refused by format_duration, which turns every delay into the stored form (the
    # mirror calls it too, and records a task's step without a delay it refuses).
    with pytest.raises(InvalidDuration, match="'5s'"):
        transitions.schedule(store, run_id, "a", retry_delay=bad)
    assert store.list_step_states(run_id) == []


def test_errors_carry_type_message_traceback_stack_and_code(store: WorkflowStore) -> None:
    ids = write_every_way(store)
    [run] = rows(
        store,
        "SELECT CAST(error AS text) AS error FROM workflow_runs WHERE workflow_run_id = :r",
        r=ids["run"],
    )
    error = json.loads(run["error"])
    assert set(error) == {"type", "message", "traceback", "stack", "code"}
    assert error["code"] == "PAYMENT_DECLINED"
    assert error["message"] == "declined"
    assert error["stack"] == error["traceback"] and "Traceback" in error["stack"]
    attempts = rows(
        store,
        "SELECT CAST(error AS text) AS error FROM workflow_step_history WHERE error IS NOT NULL",
    )
    kinds = {json.loads(a["error"])["type"]: json.loads(a["error"]) for a in attempts}
    # An error with no code of its own has no code key (Pikku's code is optional).
    assert "code" not in kinds["ValueError"]
    assert kinds["ValueError"]["stack"].startswith("Traceback")


# --- PostgreSQL: the pikku_compat views ------------------------------------------


@pytest.fixture
def pg_store(pg_engine: sa.Engine) -> Iterator[WorkflowStore]:
    truncate(pg_engine)
    yield WorkflowStore(pg_engine)


def _columns(store: WorkflowStore, schema: str, table: str) -> list[tuple[str, str]]:
    found = rows(
        store,
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = :s AND table_name = :t ORDER BY ordinal_position",
        s=schema,
        t=table,
    )
    return [(row["column_name"], row["data_type"]) for row in found]


def test_the_views_show_every_column_under_its_name_with_json_as_text(
    pg_store: WorkflowStore,
) -> None:
    [home] = rows(pg_store, "SELECT current_schema() AS s")
    for table, json_columns in JSON_COLUMNS.items():
        ours = _columns(pg_store, home["s"], table)
        view = _columns(pg_store, COMPAT_SCHEMA, table)
        assert [name for name, _ in view] == [name for name, _ in ours], table
        for (name, kind), (_, shown) in zip(ours, view, strict=True):
            if name in json_columns:
                assert (kind, shown) == ("jsonb", "text"), (table, name)
            else:
                assert shown == kind, (table, name)


def test_a_reader_on_the_views_gets_json_text_decoding_to_the_values(
    pg_store: WorkflowStore,
) -> None:
    run_id = pg_store.create_run("checkout", {"order": 1})
    pg_store.update_run_state(run_id, "receipt_id", "r-1")
    pg_store.runs.update_run_status(run_id, "completed", output="order 1 shipped")
    with pg_store.engine.connect() as conn:
        conn.exec_driver_sql("SET search_path TO pikku_compat")
        row = (
            conn.execute(
                sa.text(
                    "SELECT input, output, state, inline FROM workflow_runs "
                    "WHERE workflow_run_id = :r"
                ),
                {"r": run_id},
            )
            .mappings()
            .one()
        )
    assert all(isinstance(row[name], str) for name in ("input", "output", "state"))
    # Parsed once, each is the value: a JSON string is a string, keys keep their case.
    assert json.loads(row["output"]) == "order 1 shipped"
    assert json.loads(row["state"]) == {"receipt_id": "r-1"}
    assert json.loads(row["input"]) == {"order": 1}
    assert row["inline"] is False


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE pikku_compat.workflow_runs SET status = 'failed'",
        "DELETE FROM pikku_compat.workflow_step",
        "UPDATE pikku_compat.workflow_step_history SET status = 'failed'",
        "UPDATE pikku_compat.workflow_versions SET status = 'declined'",
        "INSERT INTO pikku_compat.workflow_runs (workflow_run_id, workflow, status, input) "
        "VALUES ('x', 'w', 'running', '{}')",
    ],
)
def test_writing_through_a_view_fails_and_says_the_views_are_read_only(
    pg_store: WorkflowStore, statement: str
) -> None:
    run_id = pg_store.create_run("checkout", {})
    transitions.schedule(pg_store, run_id, "a")
    pg_store.versions.upsert_workflow_version("checkout", "h1", {}, "dsl")
    with pytest.raises(sa.exc.DBAPIError) as failed, pg_store.engine.begin() as conn:
        conn.exec_driver_sql(statement)
    assert getattr(failed.value.orig, "sqlstate", None) == "25006"
    assert "read-only view" in str(failed.value.orig)
    assert pg_store.get_run(run_id).status == "running"


# --- rows in Pikku's forms, read through the store and the command line -----------


def test_a_run_in_pikkus_forms_reads_through_the_store(store: WorkflowStore) -> None:
    foreign = insert_foreign_run(store.engine)
    run = store.get_run(foreign.run_id)
    assert (run.created_at, run.updated_at) == (foreign.created_at, foreign.updated_at)
    if store.dialect == "sqlite":
        # Pikku's 'true'/'false' text: 'false' is False.
        assert (run.inline, run.deterministic) == (True, False)
        assert run.input == {"order": 1}
        assert run.output == "order 1 shipped"  # a bare string, not JSON
        assert run.error == PIKKU_ERROR
        assert run.state == {"receiptId": "r-1"}
    else:
        # JSON stored as a JSON string: given back as that string, decoded once.
        assert run.input == '{"order": 1}'
        assert run.output == '"order 1 shipped"'
        assert run.error == {"message": json.dumps(PIKKU_ERROR)}
        assert run.state == '{"receiptId": "r-1"}'
    steps = {s.step_name: s for s in store.list_step_states(foreign.run_id)}
    assert steps["charge"].retry_delay == "5s"
    assert steps["charge"].retry_delay_seconds == 5.0
    assert steps["ship"].retry_delay_seconds == 0.2
    history = {a.step_name: a for a in store.get_run_history(foreign.run_id)}
    assert history["charge"].running_at == foreign.running_at
    assert history["charge"].failed_at == foreign.failed_at
    assert history["charge"].duration == foreign.failed_at - foreign.running_at
    assert history["charge"].error is not None
    version = store.get_workflow_version("pikku.order", "abc123")
    assert version is not None and version.created_at == foreign.created_at
    [listed] = store.list_runs()
    assert listed.run_id == foreign.run_id


def test_a_run_in_pikkus_forms_shows_on_the_command_line(
    store: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = insert_foreign_run(store.engine)
    url = store.engine.url.render_as_string(hide_password=False)
    assert cli.main(["--database-url", url, "runs", "show", foreign.run_id]) == codes.EXIT_OK
    shown = capsys.readouterr().out
    assert "boom at the gateway" in shown
    if store.dialect == "sqlite":
        assert "RPC_NOT_FOUND: boom at the gateway" in shown
        assert "2026-12-01 07:09:14 UTC" in shown
    assert cli.main(["--database-url", url, "runs", "list"]) == codes.EXIT_OK
    assert foreign.run_id in capsys.readouterr().out
    assert cli.main(["--database-url", url, "runs", "show", foreign.run_id, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["run"]["created_at"] == "2026-12-01T07:09:14+00:00"
    assert {s["retry_delay"] for s in document["steps"]} == {"5s", "200ms"}


def test_old_and_foreign_sqlite_forms_read_the_same_instant(tmp_path: Any) -> None:
    store = WorkflowStore(f"sqlite:///{tmp_path / 'forms.db'}")
    store.init()
    run_id = store.create_run("checkout", {})
    at = dt.datetime(2026, 12, 1, 7, 9, 14, 822000, tzinfo=UTC)
    for text in (
        "2026-12-01T07:09:14.822Z",  # Pikku
        "2026-12-01T07:09:14.822000Z",  # pikku-celery
        "2026-12-01 07:09:14.822000",  # pikku-celery before 0005
        "2026-12-01T09:09:14.822+02:00",  # any offset
        "2026-12-01T02:09:14.822-0500",
    ):
        with store.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE workflow_runs SET created_at = :t, inline = :f"),
                {"t": text, "f": 1},
            )
        run = store.get_run(run_id)
        assert (run.created_at, run.inline) == (at, True), text
    for stored, read in (("0", False), ("'false'", False), ("'TRUE'", True), ("1", True)):
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE workflow_runs SET deterministic = {stored}")
        assert store.get_run(run_id).deterministic is read, stored
    store.close()


def _newest_as_pikku_reads(attempts: list[Any]) -> int:
    """The attempt Pikku's getRunStatus takes as a step's current one, folding the history in
    order: a later attempt replaces the one held only when it was created strictly after the
    held one completed (``succeededAt ?? failedAt``), compared as JavaScript Dates
    (milliseconds). One that never completed is never replaced (``date > undefined`` is
    false in JavaScript)."""

    def ms(moment: dt.datetime) -> int:
        return int(moment.timestamp() * 1000)

    current = attempts[0]
    for attempt in attempts[1:]:
        completed = current.succeeded_at or current.failed_at
        if completed is not None and ms(attempt.created_at) > ms(completed):
            current = attempt
    return int(current.attempt)


def test_a_retried_step_shows_its_newest_attempt_to_a_millisecond_reader(
    store: WorkflowStore,
) -> None:
    step_id = str(uuid.uuid4())
    at = time.time()
    error = '{"type":"ConnectionError","message":"gateway","traceback":null,"stack":null}'
    events = [
        StepPublished(
            id=f"{step_id}-1",
            at=at,
            step_id=step_id,
            run_id=step_id,
            step_name="charge",
            rpc_name="shop.charge",
            data_json='{"args":[],"kwargs":{}}',
            new_run=("shop.charge", "{}", '{"type":"task"}'),
        ),
        AttemptStarted(id=f"{step_id}-2", at=at, step_id=step_id, attempt=1, worker="w", pid=1),
        # The failure and the retry's schedule at one instant, as Celery's retry has them.
        AttemptRetried(id=f"{step_id}-3", at=at, step_id=step_id, attempt=1, error_json=error),
    ]
    store.batches.apply_batch(plan([Pending(n, e) for n, e in enumerate(events)]))
    history = store.get_run_history(step_id)
    assert [(a.attempt, a.status) for a in history] == [(1, "failed"), (2, "scheduled")]
    assert _newest_as_pikku_reads(history) == 2


def test_a_lost_attempt_retried_shows_the_new_attempt_to_a_millisecond_reader(
    store: WorkflowStore,
) -> None:
    run_id = store.create_run("charge", {"args": [], "kwargs": {}}, wire={"type": "task"})
    step_id = transitions.schedule(
        store, run_id, "charge", rpc_name="shop.charge", data={"args": []}
    )
    store.attempts.record_attempt(step_id, 1, "running", task_id=step_id, worker="gone@host", pid=4)
    lost = {"type": "WorkerLost", "message": "lost", "traceback": None}
    [seen] = store.reaping.open_attempts(idle_for=0)
    assert store.reaping.mark_lost(step_id, 1, seen.delivery_count, lost)
    assert store.reaping.give_up_lost(run_id, step_id, 1, lost, retry=True, settle_run=True)
    history = store.get_run_history(run_id)
    assert [(a.attempt, a.status) for a in history] == [(1, "lost"), (2, "scheduled")]
    # Given up: the lost attempt has ended, before the next one was created.
    assert history[0].failed_at is not None and history[0].failed_at < history[1].created_at
    assert _newest_as_pikku_reads(history) == 2
