"""The partitioned layout on a real PostgreSQL: converting keeps every row with its day,
keys keep their names with ``run_day`` at the end, the compat views still read and refuse
writes; days are made ahead and dropped (never one with an open run), and prune drops
whole days before it deletes the rest."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery
from sqlalchemy.sql.schema import ColumnCollectionConstraint

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.errors import ConfigurationError, LayoutUnavailable
from pikku_celery.schema import metadata, migrate, partitions
from pikku_celery.store.prune import PruneCount
from tests.conftest import PgServer
from tests.support.seed import add_runs

UTC = dt.timezone.utc
TODAY = dt.datetime.now(UTC).date()
SIX = partitions.PARTITIONED_TABLES
DAY = dt.timedelta(days=1)


@pytest.fixture
def plain_url(pg_server: PgServer) -> Iterator[str]:
    """A database of its own at the head revision, in the plain layout."""
    url = pg_server.create_database("pikku_parts")
    store = WorkflowStore(url)
    store.init()
    store.close()
    yield url


@pytest.fixture
def store(plain_url: str) -> Iterator[WorkflowStore]:
    made = WorkflowStore(plain_url)
    yield made
    made.close()


def rows(engine: sa.Engine, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def one(engine: sa.Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar_one()


def day_of(store: WorkflowStore, run_id: str) -> dt.date:
    day: dt.date = one(
        store.engine,
        "SELECT (created_at AT TIME ZONE 'UTC')::date FROM workflow_runs "
        "WHERE workflow_run_id = :id",
        id=run_id,
    )
    return day


def add_run_rows(store: WorkflowStore, run_id: str, day: dt.date | None) -> None:
    """An event, an open chord and a counted delivery of the run (``day`` as their run_day:
    None as rows written before revision 0016 have it)."""
    with store.engine.begin() as conn:
        params = {"run": run_id, "day": day, "id": str(uuid.uuid4())}
        conn.execute(
            sa.text(
                "INSERT INTO pikku_celery_run_events (event_id, workflow_run_id, name, sent_at, "
                "run_day) VALUES (:id, :run, 'ping', now(), :day)"
            ),
            params,
        )
        conn.execute(
            sa.text(
                "INSERT INTO pikku_celery_chords (body_id, workflow_run_id, created_at, run_day) "
                "VALUES (:id, :run, now(), :day)"
            ),
            params,
        )
        conn.execute(
            sa.text(
                "INSERT INTO pikku_celery_deliveries (event_id, workflow_run_id, created_at, "
                "run_day) VALUES (:id, :run, now(), :day)"
            ),
            params,
        )


def seed_days(store: WorkflowStore, ages: dict[int, list[str]]) -> dict[int, list[str]]:
    """Runs of ``age`` days ago in each status listed, each with a step, two attempts, an
    event, a chord and a delivery; by age, the run ids."""
    made: dict[int, list[str]] = {}
    for age, statuses in ages.items():
        ids = add_runs(store, len(statuses), age=dt.timedelta(days=age), statuses=statuses)
        # add_runs spaces runs a second apart from one instant: keep them on one day.
        with store.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE workflow_runs SET created_at = date_trunc('day', now() AT TIME "
                    "ZONE 'UTC') AT TIME ZONE 'UTC' - make_interval(days => :age) + "
                    "interval '12 hours', run_day = (now() AT TIME ZONE 'UTC')::date - :age "
                    "WHERE workflow_run_id = ANY(:ids)"
                ),
                {"age": age, "ids": ids},
            )
            for table in SIX[1:3]:
                conn.execute(
                    sa.text(
                        f"UPDATE {table} SET run_day = (now() AT TIME ZONE 'UTC')::date - :age "
                        "WHERE workflow_run_id = ANY(:ids)"
                    ),
                    {"age": age, "ids": ids},
                )
        for run_id in ids:
            add_run_rows(store, run_id, TODAY - dt.timedelta(days=age))
        made[age] = ids
    return made


def count_all(engine: sa.Engine) -> dict[str, int]:
    return {table: one(engine, f"SELECT count(*) FROM {table}") for table in SIX}


def keys_of(engine: sa.Engine) -> dict[tuple[str, str], tuple[str, list[str]]]:
    """Every primary, unique and foreign key of the six tables: (table, name) -> (kind,
    columns)."""
    found = rows(
        engine,
        "SELECT c.conrelid::regclass::text, c.conname, c.contype, array(SELECT a.attname "
        "FROM unnest(c.conkey) WITH ORDINALITY k(n, o) JOIN pg_attribute a ON a.attrelid = "
        "c.conrelid AND a.attnum = k.n ORDER BY k.o) FROM pg_constraint c WHERE "
        "c.conrelid = ANY(CAST(:tables AS regclass[])) AND c.contype IN ('p', 'u', 'f') "
        "AND c.conparentid = 0",
        tables=list(SIX),
    )
    return {(table, name): (kind, list(columns)) for table, name, kind, columns in found}


# --- converting ------------------------------------------------------------------------


def test_convert_keeps_every_row_with_its_day_and_every_key_by_name(
    store: WorkflowStore,
) -> None:
    seeded = seed_days(store, {0: ["running", "completed"], 3: ["failed"], 10: ["completed"]})
    through_store = store.create_run("wf", {"made": "by the store"})
    add_run_rows(store, through_store, None)
    with store.engine.begin() as conn:
        # Rows of before revision 0016 have no day: the conversion gives them their run's.
        conn.exec_driver_sql(
            "UPDATE workflow_runs SET run_day = NULL WHERE workflow_run_id IN "
            f"('{seeded[10][0]}', '{through_store}')"
        )
        for table in SIX[1:]:
            conn.exec_driver_sql(f"UPDATE {table} SET run_day = NULL")
        # A delivery of before revision 0013, whose run nothing told: its own day.
        conn.exec_driver_sql(
            "INSERT INTO pikku_celery_deliveries (event_id, workflow_run_id, created_at) "
            "VALUES ('orphan', '', now() - interval '5 days')"
        )
    before = count_all(store.engine)
    keys_before = keys_of(store.engine)

    done = store.partitions.convert()

    assert not done.already
    assert done.rows == before
    assert count_all(store.engine) == before
    assert store.partitions.layout() == "partitioned"
    for table in SIX:
        assert (
            one(
                store.engine,
                f"SELECT count(*) FROM {table} t JOIN workflow_runs r USING (workflow_run_id) "
                "WHERE t.run_day <> (r.created_at AT TIME ZONE 'UTC')::date",
            )
            == 0
        ), table
    assert one(
        store.engine, "SELECT run_day FROM pikku_celery_deliveries WHERE event_id = 'orphan'"
    ) == TODAY - dt.timedelta(days=5)
    assert one(
        store.engine,
        "SELECT run_day FROM workflow_runs WHERE workflow_run_id = :id",
        id=through_store,
    ) == day_of(store, through_store)
    # Every key keeps its name and columns, with run_day at the end; run_day is required.
    keys_after = keys_of(store.engine)
    assert set(keys_after) == set(keys_before)
    for key, (kind, columns) in keys_before.items():
        assert keys_after[key] == (kind, [*columns, "run_day"]), key
    for table in SIX:
        assert one(
            store.engine,
            "SELECT attnotnull FROM pg_attribute WHERE attrelid = CAST(:t AS regclass) "
            "AND attname = 'run_day'",
            t=table,
        )
        assert one(
            store.engine,
            "SELECT count(*) FROM pg_constraint WHERE conrelid = CAST(:t AS regclass) "
            "AND contype = 'f' AND confdeltype = 'c' AND conparentid = 0",
            t=table,
        ) == sum(1 for (t, _), (k, _c) in keys_before.items() if t == table and k == "f")
    # One partition per day present, today and the next two, and a default one.
    days = {TODAY - dt.timedelta(days=n) for n in (0, 3, 5, 10)} | {TODAY + DAY, TODAY + 2 * DAY}
    assert set(done.days) == days
    for table in SIX:
        with store.engine.connect() as conn:
            assert set(partitions.partition_days(conn, table)) == days
        assert one(store.engine, "SELECT to_regclass(:p) IS NOT NULL", p=f"{table}_pdefault")
        assert one(store.engine, f"SELECT count(*) FROM {table}_pdefault") == 0
    # The store reads what it wrote.
    assert store.get_run(seeded[3][0]).status == "failed"
    assert len(store.list_step_states(seeded[10][0])) == 1
    assert len(store.get_run_history(seeded[10][0])) == 2


def test_the_compat_views_still_read_and_refuse_writes(store: WorkflowStore) -> None:
    seed_days(store, {1: ["completed"]})
    views = ("workflow_runs", "workflow_step", "workflow_step_history")
    definitions = {
        view: one(
            store.engine, "SELECT pg_get_viewdef(CAST(:v AS regclass))", v=f"pikku_compat.{view}"
        )
        for view in views
    }
    store.partitions.convert()
    for view in views:
        name = f"pikku_compat.{view}"
        assert (
            one(store.engine, "SELECT pg_get_viewdef(CAST(:v AS regclass))", v=name)
            == (definitions[view])
        )
        assert one(store.engine, f"SELECT count(*) FROM {name}") >= 1
        assert one(
            store.engine,
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = CAST(:v AS regclass)",
            v=name,
        ).startswith(f"CREATE TRIGGER read_only INSTEAD OF INSERT OR DELETE OR UPDATE ON {name}")
        with pytest.raises(sa.exc.DBAPIError), store.engine.begin() as conn:
            conn.exec_driver_sql(f"DELETE FROM {name}")
    assert one(store.engine, "SELECT count(*) FROM pikku_compat.workflow_runs") == 1


def test_a_second_convert_changes_nothing(store: WorkflowStore) -> None:
    seed_days(store, {2: ["completed"]})
    store.partitions.convert()
    keys = keys_of(store.engine)
    counts = count_all(store.engine)
    again = WorkflowStore(store.engine).partitions.convert()
    assert again.already
    assert "already partitioned" in again.describe()
    assert keys_of(store.engine) == keys
    assert count_all(store.engine) == counts


def test_a_refused_conversion_changes_nothing(store: WorkflowStore) -> None:
    seed_days(store, {2: ["completed"]})
    with store.engine.begin() as conn:
        conn.exec_driver_sql("CREATE VIEW mine AS SELECT workflow_run_id FROM workflow_step")
    keys = keys_of(store.engine)
    with pytest.raises(LayoutUnavailable, match="nothing was changed"):
        store.partitions.convert()
    assert WorkflowStore(store.engine).partitions.layout() == "plain"
    assert keys_of(store.engine) == keys
    assert one(store.engine, "SELECT count(*) FROM pikku_compat.workflow_step") == 1


def test_sqlite_and_a_schema_behind_are_refused_with_what_to_do(
    tmp_path: Path, pg_server: PgServer
) -> None:
    sqlite = WorkflowStore(f"sqlite:///{tmp_path / 'plain.db'}")
    sqlite.init()
    with pytest.raises(LayoutUnavailable, match="the partitioned layout needs PostgreSQL"):
        sqlite.partitions.convert()
    with pytest.raises(LayoutUnavailable, match="needs PostgreSQL"):
        partitions.convert(sqlite.engine)
    assert sqlite.partitions.layout() == "plain"
    sqlite.close()

    behind = WorkflowStore(pg_server.create_database("pikku_parts_behind"))
    migrate.upgrade(behind.engine, "0015")
    with pytest.raises(LayoutUnavailable, match="run `pikku-celery db upgrade` first"):
        behind.partitions.convert()
    assert behind.partitions.layout() == "plain"
    behind.close()


def test_the_plain_layout_keeps_the_declared_keys(store: WorkflowStore) -> None:
    """``tables.py`` declares the plain layout: its keys never name run_day, and a database
    upgraded without --layout has exactly them."""
    declared: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for table in SIX:
        for constraint in metadata.tables[table].constraints:
            if not isinstance(constraint, ColumnCollectionConstraint):
                continue
            kind = {
                sa.PrimaryKeyConstraint: "p",
                sa.UniqueConstraint: "u",
                sa.ForeignKeyConstraint: "f",
            }.get(type(constraint))
            if kind is None:
                continue
            columns = [column.name for column in constraint.columns]
            assert "run_day" not in columns
            declared[(table, str(constraint.name))] = (kind, columns)
    assert keys_of(store.engine) == declared
    assert store.partitions.layout() == "plain"


# --- making and dropping days -------------------------------------------------------------


def test_make_days_makes_what_is_missing_and_moves_rows_out_of_the_defaults(
    store: WorkflowStore,
) -> None:
    store.partitions.convert()
    later = TODAY + dt.timedelta(days=20)
    run_id = str(uuid.uuid4())
    with store.engine.begin() as conn:
        # A row of a day with no partition: kept in the default one, not refused.
        conn.execute(
            sa.text(
                "INSERT INTO workflow_runs (workflow_run_id, workflow, status, input, run_day) "
                "VALUES (:id, 'wf', 'completed', '{}', :day)"
            ),
            {"id": run_id, "day": later},
        )
        conn.execute(
            sa.text(
                "INSERT INTO workflow_step (workflow_step_id, workflow_run_id, step_name, "
                "run_day) VALUES (:id, :id, 'work', :day)"
            ),
            {"id": run_id, "day": later},
        )
    kept = store.partitions.keep(None)
    assert kept.in_defaults == {"workflow_runs": 1, "workflow_step": 1}
    assert kept.made == ()  # today and the next two days were made by the conversion

    made = store.partitions.make_days(later - DAY, later)
    assert made.made == tuple(
        partitions.day_partition(table, day) for day in (later - DAY, later) for table in SIX
    )
    assert made.moved == {"workflow_step": 1, "workflow_runs": 1}
    assert one(store.engine, f"SELECT count(*) FROM workflow_runs_p{later:%Y%m%d}") == 1
    assert one(store.engine, f"SELECT count(*) FROM workflow_step_p{later:%Y%m%d}") == 1
    with store.engine.connect() as conn:
        assert partitions.default_rows(conn) == {}
    assert store.get_step_state(run_id, "work").status == "pending"
    assert store.partitions.make_days(later - DAY, later).made == ()


def test_drop_days_drops_a_finished_day_and_keeps_a_day_with_an_open_run(
    store: WorkflowStore,
) -> None:
    seeded = seed_days(
        store,
        {
            10: ["completed", "failed"],
            9: ["completed", "running"],
            8: ["suspended"],
            1: ["completed"],
        },
    )
    store.partitions.convert()
    before = count_all(store.engine)

    with store.engine.connect() as conn:
        dropped = partitions.drop_days(conn, TODAY - dt.timedelta(days=5))
    assert dropped == [TODAY - dt.timedelta(days=10)]
    gone = TODAY - dt.timedelta(days=10)
    for table in SIX:
        assert not one(
            store.engine,
            "SELECT to_regclass(:p) IS NOT NULL",
            p=partitions.day_partition(table, gone),
        )
    after = count_all(store.engine)
    # Each run had a step, two attempts, an event, a chord and a delivery.
    per_run = {SIX[0]: 1, SIX[1]: 1, SIX[2]: 2, SIX[3]: 1, SIX[4]: 1, SIX[5]: 1}
    assert after == {table: before[table] - 2 * per_run[table] for table in SIX}
    for run_id in seeded[10]:
        assert store.list_step_states(run_id) == []
    for age in (9, 8, 1):
        for run_id in seeded[age]:
            assert len(store.get_run_history(run_id)) == 2
    with store.engine.connect() as conn:
        assert set(partitions.partition_days(conn)) >= {
            TODAY - dt.timedelta(days=n) for n in (9, 8)
        }
    assert partitions.drop_days(store.engine, TODAY - dt.timedelta(days=5)) == []


def test_keep_drops_the_days_older_than_the_retention(store: WorkflowStore) -> None:
    seed_days(store, {30: ["completed"], 20: ["cancelled"], 3: ["completed"]})
    store.partitions.convert(today=TODAY - dt.timedelta(days=5))
    now = dt.datetime.combine(TODAY, dt.time(12), UTC)
    kept = store.partitions.keep(dt.timedelta(days=4), now)
    # Every day wholly before now - 4 days: the one at the cut (its noon) is not.
    assert kept.dropped_days == [TODAY - dt.timedelta(days=n) for n in (30, 20, 5)]
    assert kept.as_dict()["dropped_runs"] == 2
    with store.engine.connect() as conn:
        days = partitions.partition_days(conn)
    assert days[0] == TODAY - dt.timedelta(days=4)
    assert set(days) >= {TODAY, TODAY + DAY, TODAY + 2 * DAY}
    with pytest.raises(ValueError, match="one day or more"):
        store.partitions.keep(dt.timedelta(hours=3), now)


def test_prune_drops_whole_days_then_deletes_the_rest(store: WorkflowStore) -> None:
    seed_days(
        store,
        {
            40: ["completed", "failed"],  # all prunable: dropped whole
            38: ["completed", "cancelled"],  # cancelled is not pruned: deleted one by one
            36: ["completed", "running"],  # an open run: its day stays, the rest deleted
            1: ["completed"],  # after the cut
        },
    )
    # Converted days ago and never kept since (no reaper runs): prune makes the days ahead.
    store.partitions.convert(today=TODAY - dt.timedelta(days=10))
    pruned = store.prune(
        dt.datetime.now(UTC) - dt.timedelta(days=30), ["completed", "failed"], batch_size=1
    )
    assert pruned == PruneCount(runs=4, steps=4, attempts=8)
    with store.engine.connect() as conn:
        days = partitions.partition_days(conn)
    assert TODAY - dt.timedelta(days=40) not in days
    assert {TODAY - dt.timedelta(days=n) for n in (38, 36, 1)} <= set(days)
    assert {TODAY, TODAY + DAY, TODAY + 2 * DAY} <= set(days)
    assert sorted(run.status for run in store.list_runs(limit=10)) == [
        "cancelled",
        "completed",
        "running",
    ]


# --- the command ----------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pikku_celery", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        check=False,
    )


def test_db_upgrade_layout_partitioned_as_a_user_types_it(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database("pikku_parts_cli")
    up = cli("db", "upgrade", "--layout", "partitioned", "--database-url", url)
    assert up.returncode == 0, up.stderr
    assert "Upgraded" in up.stdout
    assert "partitioned 6 tables by run_day" in up.stdout
    again = cli("db", "upgrade", "--layout", "partitioned", "--database-url", url)
    assert again.returncode == 0, again.stderr
    assert "already partitioned" in again.stdout
    current = cli("db", "current", "--database-url", url)
    assert "layout:  partitioned" in current.stdout
    plain_url = pg_server.create_database("pikku_parts_cli_plain")
    assert cli("db", "upgrade", "--database-url", plain_url).returncode == 0
    assert "layout:  plain" in cli("db", "current", "--database-url", plain_url).stdout

    sqlite = cli(
        "db",
        "upgrade",
        "--layout",
        "partitioned",
        "--database-url",
        f"sqlite:///{tmp_path / 'x.db'}",
    )
    assert sqlite.returncode == 1
    assert "the partitioned layout needs PostgreSQL" in sqlite.stderr
    assert "Traceback" not in sqlite.stderr


# --- the workers' upkeep ------------------------------------------------------------------


def test_the_workers_upkeep_keeps_the_days_under_the_reaper_lease(
    store: WorkflowStore, plain_url: str
) -> None:
    seed_days(store, {12: ["completed"], 2: ["completed"], 1: ["running"]})
    store.partitions.convert(today=TODAY - dt.timedelta(days=3))
    app = Celery("parts-upkeep", broker="memory://", set_as_current=False)
    app.conf.pikku_retention_days = 7
    pikku = PikkuCelery(app, plain_url)
    try:
        upkeep = pikku.prepare_upkeep("w")
        assert upkeep.reap_once(at_start=True) is not None
        with store.engine.connect() as conn:
            days = partitions.partition_days(conn)
        assert TODAY - dt.timedelta(days=12) not in days  # older than the retention
        assert {TODAY - dt.timedelta(days=n) for n in (3, 2, 1)} <= set(days)
        assert {TODAY, TODAY + DAY, TODAY + 2 * DAY} <= set(days)  # made ahead
    finally:
        pikku.stop_upkeep()
        pikku.uninstall()
        pikku.mirror.close()
        pikku.store.close()


def test_the_retention_is_days_from_the_app_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = Celery("retention", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'r.db'}")
    try:
        assert pikku.retention is None  # never drop, unless asked
        monkeypatch.setenv("PIKKU_RETENTION_DAYS", "30")
        assert pikku.retention == dt.timedelta(days=30)
        app.conf.pikku_retention_days = 7
        assert pikku.retention == dt.timedelta(days=7)
        for bad in ("soon", 0, 0.5, -3):
            app.conf.pikku_retention_days = bad
            with pytest.raises(ConfigurationError, match="pikku_retention_days"):
                _ = pikku.retention
        # A plain layout: the upkeep's look at the layout is all it costs.
        app.conf.pikku_retention_days = None
        assert pikku.prepare_upkeep("w")._partitions is not None
        assert pikku._partitions_upkeep(None) is None
    finally:
        pikku.uninstall()
        pikku.mirror.close()
        pikku.store.close()
