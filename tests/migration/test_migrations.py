"""The migrations build exactly the schema the code declares, on both databases."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from pikku_celery import WorkflowStore
from pikku_celery.errors import StoreError
from pikku_celery.schema import metadata, migrate
from pikku_celery.schema.tables import read_flag
from pikku_celery.store.models import seconds_of
from tests.conftest import PgServer
from tests.support import transitions

# The attempts have none of their own: their unique key serves every read (revision 0015).
EXPECTED_INDEXES = {
    "workflow_runs": ["status", "created_at"],
    "workflow_step": ["workflow_run_id", "status"],
    "pikku_celery_chords": ["body_id"],
    "workflow_versions": ["source", "status"],
}


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        server: PgServer = request.getfixturevalue("pg_server")
        yield server.create_database("pikku_migration")


def test_upgrade_from_empty_equals_declared_schema(empty_url: str) -> None:
    store = WorkflowStore(empty_url)
    assert migrate.current_revision(store.engine) is None
    store.init()
    assert migrate.current_revision(store.engine) == migrate.head_revision()
    with store.engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "compare_server_default": False,
                "version_table": migrate.VERSION_TABLE,
            },
        )
        diff = compare_metadata(context, metadata)
    assert diff == []
    store.close()


def test_every_declared_index_exists_with_its_leading_columns(empty_url: str) -> None:
    store = WorkflowStore(empty_url)
    store.init()
    inspector = sa.inspect(store.engine)
    for table, columns in EXPECTED_INDEXES.items():
        indexed = [index["column_names"] for index in inspector.get_indexes(table)]
        assert any(found[: len(columns)] == columns for found in indexed), (table, indexed)
    uniques = {
        table: [u["column_names"] for u in inspector.get_unique_constraints(table)]
        for table in ("workflow_step", "workflow_step_history")
    }
    assert ["workflow_run_id", "step_name"] in uniques["workflow_step"]
    assert ["workflow_run_id", "workflow_step_id", "attempt"] in uniques["workflow_step_history"]
    # Every key of a run-keyed table leads with its run (revision 0013).
    for table in (
        "workflow_step",
        "workflow_step_history",
        "pikku_celery_deliveries",
        "pikku_celery_run_events",
        "pikku_celery_chords",
    ):
        key = inspector.get_pk_constraint(table)["constrained_columns"]
        assert key[0] == "workflow_run_id", (table, key)
    [to_step] = inspector.get_foreign_keys("workflow_step_history")
    assert to_step["constrained_columns"] == ["workflow_run_id", "workflow_step_id"]
    assert to_step["options"].get("ondelete") == "CASCADE"
    assert "pikku_celery_alembic_version" in inspector.get_table_names()
    assert "alembic_version" not in inspector.get_table_names()
    store.close()


def test_init_is_idempotent_across_store_instances(empty_url: str) -> None:
    first = WorkflowStore(empty_url)
    first.init()
    run_id = first.create_run("checkout", {"kept": True})
    first.close()
    second = WorkflowStore(empty_url)
    second.init()
    second.init()
    assert second.get_run(run_id).input == {"kept": True}
    assert migrate.is_current(second.engine)
    second.close()


def test_postgres_types_are_jsonb_and_timestamptz(pg_server: PgServer) -> None:
    store = WorkflowStore(pg_server.create_database("pikku_types"))
    store.init()
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_name LIKE 'workflow%' AND table_schema = current_schema()"
            )
        ).all()
    types = {(table, column): kind for table, column, kind in rows}
    assert types[("workflow_runs", "state")] == "jsonb"
    assert types[("workflow_step_history", "result")] == "jsonb"
    assert types[("workflow_step", "created_at")] == "timestamp with time zone"
    assert types[("workflow_step_history", "running_at")] == "timestamp with time zone"
    store.close()


def test_concurrent_init_from_several_processes_succeeds(empty_url: str) -> None:
    # Worker processes start together and each brings the schema up: none may fail.
    script = (
        "import sys; from pikku_celery import WorkflowStore; "
        "s = WorkflowStore(sys.argv[1]); s.init(); s.close()"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, empty_url], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=120)[1].decode() for proc in procs]
    failures = [out for proc, out in zip(procs, outputs, strict=True) if proc.returncode]
    assert failures == []
    store = WorkflowStore(empty_url)
    assert migrate.is_current(store.engine)
    store.close()


def test_sqlite_cascades_work_on_every_connection(tmp_path: Path) -> None:
    store = WorkflowStore(f"sqlite:///{tmp_path / 'fk.db'}")
    store.init()
    run_id = store.create_run("checkout", {})
    transitions.schedule(store, run_id, "a")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    assert store.delete_run(run_id)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM workflow_step").scalar() == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM workflow_step_history").scalar() == 0
    store.close()


def test_a_store_on_an_unmigrated_database_says_what_to_do(tmp_path: Path) -> None:
    from pikku_celery import SchemaNotCurrent

    store = WorkflowStore(f"sqlite:///{tmp_path / 'bare.db'}")
    with pytest.raises(SchemaNotCurrent, match="db upgrade"):
        store.create_run("checkout", {})
    store.close()


def test_upgrade_from_0001_keeps_rows_and_adds_attempt_columns(empty_url: str) -> None:
    store = WorkflowStore(empty_url)
    migrate.upgrade(store.engine, "0001")
    assert store.schema_revision() == "0001"
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO workflow_runs (workflow_run_id, workflow, status, input) "
            "VALUES ('r1', 'old', 'running', '{}')"
        )
        conn.exec_driver_sql(
            "INSERT INTO workflow_step (workflow_step_id, workflow_run_id, step_name, "
            "current_attempt) VALUES ('s1', 'r1', 'old-step', 1)"
        )
        conn.exec_driver_sql(
            "INSERT INTO workflow_step_history (history_id, workflow_step_id, status, attempt) "
            "VALUES ('h1', 's1', 'running', 1)"
        )
    store.init()
    assert store.schema_revision() == migrate.head_revision()
    store.attempts.record_attempt("s1", 1, "succeeded", result="done")
    [attempt] = store.get_run_history("r1")
    assert (attempt.step_name, attempt.status, attempt.result) == ("old-step", "succeeded", "done")
    assert (attempt.delivery_count, attempt.worker) == (0, None)
    store.close()


def _raw(engine: sa.Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.exec_driver_sql(sql)]


def _write_0004_rows(engine: sa.Engine) -> None:
    """Rows as pikku-celery wrote them before 0005: naive times, 0/1, bare seconds."""
    sqlite = engine.dialect.name == "sqlite"
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO workflow_runs (workflow_run_id, workflow, status, input, inline, "
            "deterministic, created_at, updated_at) VALUES ('r1', 'old', 'running', '{}', "
            + ("1, 0, '2026-12-01 07:09:14.822425', '2026-12-01 07:09:14'" if sqlite else "")
            + ("" if sqlite else "true, false, now(), now()")
            + ")"
        )
        for step, delay in (("s1", "180"), ("s2", "0.2"), ("s3", "exponential"), ("s4", None)):
            conn.execute(
                sa.text(
                    "INSERT INTO workflow_step (workflow_step_id, workflow_run_id, step_name, "
                    "retry_delay, current_attempt) VALUES (:s, 'r1', :s, :d, 1)"
                ),
                {"s": step, "d": delay},
            )
        conn.exec_driver_sql(
            "INSERT INTO workflow_step_history (history_id, workflow_step_id, status, attempt, "
            "running_at) VALUES ('h1', 's1', 'running', 1, "
            + ("'2026-12-01 07:09:15.000001'" if sqlite else "now()")
            + ")"
        )


def test_0005_converts_old_rows_and_its_downgrade_restores_them(empty_url: str) -> None:
    store = WorkflowStore(empty_url)
    sqlite = store.dialect == "sqlite"
    migrate.upgrade(store.engine, "0004")
    _write_0004_rows(store.engine)
    migrate.upgrade(store.engine, "0005")

    delays = dict(_raw(store.engine, "SELECT workflow_step_id, retry_delay FROM workflow_step"))
    # A value that is no duration (another writer's) is left as it was.
    assert delays == {"s1": "180s", "s2": "200ms", "s3": "exponential", "s4": None}
    run = store.get_run("r1")
    assert (run.inline, run.deterministic) == (True, False)
    if sqlite:
        assert _raw(
            store.engine, "SELECT created_at, updated_at, inline, deterministic FROM workflow_runs"
        ) == [("2026-12-01T07:09:14.822425Z", "2026-12-01T07:09:14.000000Z", "true", "false")]
        assert _raw(store.engine, "SELECT running_at FROM workflow_step_history") == [
            ("2026-12-01T07:09:15.000001Z",)
        ]
        assert run.created_at == dt.datetime(2026, 12, 1, 7, 9, 14, 822425, tzinfo=dt.timezone.utc)
    else:
        assert _raw(
            store.engine,
            "SELECT count(*) FROM information_schema.views WHERE table_schema = 'pikku_compat'",
        ) == [(4,)]
    # Read as the store reads them (its step query wants later revisions' columns).
    ordered = [delays[step] for step in ("s1", "s2", "s3", "s4")]
    assert [seconds_of(d) for d in ordered] == [180.0, 0.2, None, None]

    migrate.downgrade(store.engine, "0004")
    assert store.schema_revision() == "0004"
    delays = dict(_raw(store.engine, "SELECT workflow_step_id, retry_delay FROM workflow_step"))
    assert delays == {"s1": "180", "s2": "0.2", "s3": "exponential", "s4": None}
    if sqlite:
        assert _raw(
            store.engine, "SELECT created_at, updated_at, inline, deterministic FROM workflow_runs"
        ) == [("2026-12-01 07:09:14.822425", "2026-12-01 07:09:14.000000", 1, 0)]
        assert _raw(store.engine, "SELECT running_at FROM workflow_step_history") == [
            ("2026-12-01 07:09:15.000001",)
        ]
    else:
        assert _raw(
            store.engine,
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'pikku_compat'",
        ) == [(0,)]
    store.init()
    assert store.get_run("r1").inline is True
    store.close()


def test_every_revision_goes_down_to_nothing_and_back(empty_url: str) -> None:
    store = WorkflowStore(empty_url)
    store.init()
    store.create_run("checkout", {})
    # The compat views depend on the tables: they go first, and come back with them.
    migrate.downgrade(store.engine, "base")
    assert store.schema_revision() is None
    assert "workflow_runs" not in sa.inspect(store.engine).get_table_names()
    store.init()
    assert store.list_runs() == []
    run_id = store.create_run("checkout", {"again": True})
    assert store.get_run(run_id).input == {"again": True}
    store.close()


def test_the_compat_downgrade_drops_only_its_views_and_never_a_pikku_services_tables(
    pg_server: PgServer,
) -> None:
    """A Pikku service on ``search_path=pikku_compat`` makes its own tables in the schema."""
    url = pg_server.create_database()
    store = WorkflowStore(url)
    try:
        store.init()
        with store.engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE pikku_compat.channels (id text PRIMARY KEY)")
            conn.exec_driver_sql("INSERT INTO pikku_compat.channels VALUES ('kept')")
        with pytest.raises(StoreError) as refused:
            migrate.downgrade(store.engine, "0004")
        message = str(refused.value)
        assert "channels" in message and "SET SCHEMA public" in message
        # Nothing was dropped: the views still read, the service's row is there.
        assert _raw(store.engine, "SELECT id FROM pikku_compat.channels") == [("kept",)]
        assert _raw(store.engine, "SELECT count(*) FROM pikku_compat.workflow_runs") == [(0,)]

        with store.engine.begin() as conn:  # as the message says
            conn.exec_driver_sql("ALTER TABLE pikku_compat.channels SET SCHEMA public")
        migrate.downgrade(store.engine, "0004")
        schemas = "SELECT count(*) FROM pg_namespace WHERE nspname = 'pikku_compat'"
        assert _raw(store.engine, schemas) == [(0,)]
        assert _raw(store.engine, "SELECT id FROM public.channels") == [("kept",)]
    finally:
        store.close()


def _write_0012_rows(engine: sa.Engine) -> None:
    """A run with two steps and their attempts, a chord whose body is written and one whose
    body is not, a counted delivery and an event, as revision 0012 kept them."""
    at = "2026-12-01T07:09:14.000000Z"
    with engine.begin() as conn:

        def write(sql: str, **params: Any) -> None:
            conn.execute(sa.text(sql), {"at": at, **params})

        for run_id in ("r1", "r2"):
            write(
                "INSERT INTO workflow_runs (workflow_run_id, workflow, status, input, "
                "created_at, updated_at) VALUES (:r, 'old', 'running', '{}', :at, :at)",
                r=run_id,
            )
        for step_id, run_id, name in (("s1", "r1", "a"), ("s2", "r1", "b"), ("s3", "r2", "a")):
            write(
                "INSERT INTO workflow_step (workflow_step_id, workflow_run_id, step_name, "
                "status, current_attempt, created_at, updated_at) "
                "VALUES (:s, :r, :n, 'running', 1, :at, :at)",
                s=step_id,
                r=run_id,
                n=name,
            )
        for history_id, step_id, attempt in (("h1", "s1", 1), ("h2", "s1", 2), ("h3", "s3", 1)):
            write(
                "INSERT INTO workflow_step_history (history_id, workflow_step_id, status, "
                "attempt, created_at) VALUES (:h, :s, 'running', :n, :at)",
                h=history_id,
                s=step_id,
                n=attempt,
            )
        write("INSERT INTO pikku_celery_deliveries (event_id, created_at) VALUES ('d1', :at)")
        write(
            "INSERT INTO pikku_celery_run_events (event_id, workflow_run_id, name, sent_at) "
            "VALUES ('e1', 'r1', 'paid', :at)"
        )
        for body_id in ("s2", "not-out"):
            write(
                "INSERT INTO pikku_celery_chords (body_id, workflow_run_id, created_at) "
                "VALUES (:b, 'r1', :at)",
                b=body_id,
            )


def test_0013_keys_rows_of_0012_by_their_run_and_its_downgrade_keeps_them(
    empty_url: str,
) -> None:
    store = WorkflowStore(empty_url)
    migrate.upgrade(store.engine, "0012")
    _write_0012_rows(store.engine)
    migrate.upgrade(store.engine, "0013")

    history = "SELECT history_id, workflow_run_id FROM workflow_step_history ORDER BY history_id"
    assert _raw(store.engine, history) == [("h1", "r1"), ("h2", "r1"), ("h3", "r2")]
    # Nothing told a delivery of before its run: it is kept under no run, and goes by age.
    assert _raw(store.engine, "SELECT workflow_run_id, event_id FROM pikku_celery_deliveries") == [
        ("", "d1")
    ]
    assert _raw(store.engine, "SELECT workflow_run_id, event_id FROM pikku_celery_run_events") == [
        ("r1", "e1")
    ]
    chords = dict(_raw(store.engine, "SELECT body_id, body_written FROM pikku_celery_chords"))
    assert {body: read_flag(flag) for body, flag in chords.items()} == {
        "s2": True,
        "not-out": False,
    }
    # The store (at the revision it ships with) reads and writes the rows 0013 kept: an
    # attempt goes on by its run.
    migrate.upgrade(store.engine)
    store.attempts.record_attempt("s1", 2, "succeeded", result="done")
    attempts = [(a.step_name, a.attempt, a.status) for a in store.get_run_history("r1")]
    assert attempts == [("a", 1, "running"), ("a", 2, "succeeded")]
    # The open chord whose body is not out still holds its run.
    store.attempts.record_attempt("s2", 1, "succeeded", result="b")
    store.attempts.record_attempt("s1", 1, "succeeded", result="a")
    assert not store.attempts.complete_run_if_done("r1")
    # A run's deletion still takes its steps' attempts with it, through the run-keyed key.
    assert store.delete_run("r2")
    assert _raw(store.engine, "SELECT count(*) FROM workflow_step_history") == [(3,)]
    assert _raw(store.engine, "SELECT count(*) FROM workflow_step_history WHERE attempt = 1") == [
        (2,)  # s1's and s2's; s3's went with its run
    ]

    # A step id written in a second run, which the new keys allow: the old ones do not,
    # so the downgrade keeps the first row and its attempts.
    store.create_run("again", {}, run_id="r3")
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO workflow_step (workflow_step_id, workflow_run_id, step_name, "
                "status, created_at, updated_at) VALUES ('s1', 'r3', 'a', 'running', :at, :at)"
            ),
            {"at": dt.datetime.now(dt.timezone.utc)},
        )
    store.attempts.record_attempt("s1", 1, "running", run_id="r3")

    migrate.downgrade(store.engine, "0012")
    kept = "SELECT workflow_step_id, attempt FROM workflow_step_history ORDER BY 1, 2"
    assert _raw(store.engine, kept) == [("s1", 1), ("s1", 2), ("s2", 1)]
    assert _raw(
        store.engine, "SELECT workflow_run_id FROM workflow_step WHERE workflow_step_id = 's1'"
    ) == [("r1",)]
    assert _raw(store.engine, "SELECT event_id FROM pikku_celery_deliveries") == [("d1",)]
    bodies = "SELECT body_id FROM pikku_celery_chords ORDER BY body_id"
    assert _raw(store.engine, bodies) == [("not-out",), ("s2",)]
    store.init()
    assert [a.attempt for a in store.get_run_history("r1")] == [1, 2, 1]


def test_a_chord_half_done_before_0014_fires_once_after_the_upgrade(empty_url: str) -> None:
    # At 0012 a chord was counted by joining its parts to the results; from 0014 each part
    # says whether it is done. The upgrade marks the parts whose results are in.
    from pikku_celery.store import MirrorBatch, ResultWrite, now

    store = WorkflowStore(empty_url)
    migrate.upgrade(store.engine, "0012")
    # The tables as they were at 0012, not as declared now.
    chords = sa.table(
        "pikku_celery_result_chords",
        sa.column("group_id"),
        sa.column("size"),
        sa.column("body", sa.LargeBinary),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    parts = sa.table(
        "pikku_celery_result_chord_parts",
        sa.column("group_id"),
        sa.column("task_id"),
        sa.column("position"),
    )
    results = sa.table(
        "pikku_celery_results",
        sa.column("task_id"),
        sa.column("status"),
        sa.column("attempt"),
        sa.column("meta", sa.LargeBinary),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    at = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    with store.engine.begin() as conn:
        conn.execute(sa.insert(chords).values(group_id="g1", size=3, body=b"body", created_at=at))
        conn.execute(
            sa.insert(parts),
            [
                {"group_id": "g1", "task_id": task_id, "position": position}
                for position, task_id in enumerate(("p1", "p2", "p3"))
            ],
        )
        conn.execute(
            sa.insert(results),
            [
                {"task_id": t, "status": s, "attempt": 1, "meta": b"{}", "updated_at": at}
                for t, s in (("p1", "SUCCESS"), ("p2", "STARTED"))
            ],
        )
    store.init()
    assert store.schema_revision() == migrate.head_revision()
    done = dict(_raw(store.engine, "SELECT task_id, done FROM pikku_celery_result_chord_parts"))
    assert {task_id: bool(flag) for task_id, flag in done.items()} == {
        "p1": True,
        "p2": False,
        "p3": False,
    }

    def finish(task_id: str) -> list[str]:
        row = ResultWrite(task_id, 1, "SUCCESS", b"{}", now())
        fired = store.batches.apply_batch(MirrorBatch(results=[row])).fired
        return [chord.group_id for chord in fired]

    assert finish("p3") == []
    assert finish("p2") == ["g1"]
    assert finish("p2") == []  # delivered again: fired once
    store.close()


def test_0015_drops_the_attempts_step_index_and_its_downgrade_makes_it_again(
    empty_url: str,
) -> None:
    store = WorkflowStore(empty_url)
    # The store writes at the revision it ships with; the rows stay through the others.
    migrate.upgrade(store.engine)
    run_id = store.create_run("checkout", {})
    transitions.schedule(store, run_id, "charge", step_id="s1")
    transitions.start(store, "s1")
    migrate.downgrade(store.engine, "0014")

    def indexes() -> dict[str, list[str]]:
        found = sa.inspect(store.engine).get_indexes("workflow_step_history")
        return {str(index["name"]): [str(c) for c in index["column_names"]] for index in found}

    step_index = ["workflow_run_id", "workflow_step_id", "created_at"]
    assert indexes()["idx_workflow_step_history_step"] == step_index
    migrate.upgrade(store.engine, "0015")
    assert "idx_workflow_step_history_step" not in indexes()
    migrate.upgrade(store.engine)
    transitions.succeed(store, "s1", 1, "paid")
    migrate.downgrade(store.engine, "0014")
    assert indexes()["idx_workflow_step_history_step"] == step_index
    attempts = [(a.step_name, a.attempt, a.status) for a in store.get_run_history(run_id)]
    assert attempts == [("charge", 1, "succeeded")]
    store.close()


def test_0016_gives_the_run_tables_their_day_and_its_downgrade_keeps_every_row(
    empty_url: str,
) -> None:
    store = WorkflowStore(empty_url)
    migrate.upgrade(store.engine)
    run_id = store.create_run("checkout", {})
    transitions.schedule(store, run_id, "charge", step_id="s1")
    transitions.start(store, "s1")
    made = store.get_run(run_id).created_at.astimezone(dt.timezone.utc).date()
    for table in ("workflow_runs", "workflow_step", "workflow_step_history"):
        [(day,)] = _raw(store.engine, f"SELECT run_day FROM {table}")
        assert str(day) == made.isoformat(), table

    migrate.downgrade(store.engine, "0015")
    for table in ("workflow_runs", "workflow_step", "workflow_step_history"):
        columns = [c["name"] for c in sa.inspect(store.engine).get_columns(table)]
        assert "run_day" not in columns, table
    assert _raw(store.engine, "SELECT status FROM workflow_step_history") == [("running",)]
    if store.dialect == "postgresql":
        assert _raw(store.engine, "SELECT count(*) FROM pikku_compat.workflow_step_history") == [
            (1,)
        ]
    migrate.upgrade(store.engine)
    # Rows of before the column keep no day until the partitioned layout fills it.
    assert _raw(store.engine, "SELECT run_day FROM workflow_runs") == [(None,)]
    transitions.succeed(store, "s1", 1, "paid")
    assert [(a.attempt, a.status) for a in store.get_run_history(run_id)] == [(1, "succeeded")]
    store.close()
