"""Store transitions per second against the raw-driver floor, on PostgreSQL and SQLite.

Run from the project root::

    python -m bench.store_bench            # the full run, a few minutes
    python -m bench.store_bench --quick    # small numbers, under a minute

The floor is the very SQL the store sends, captured from the store itself with
a ``before_cursor_execute`` listener and replayed with fresh parameters straight
through psycopg 3 or the stdlib ``sqlite3`` module, one transaction per
transition as the store does. What separates the two is the store's own cost.

The index check times one transition and one ``get_step_state`` with about a
thousand attempt rows in ``workflow_step_history`` and again with about a
million, and prints the query plans of the statements involved.

The bench creates and drops its own databases (``pikku_bench`` and
``pikku_bench_big`` on the PostgreSQL server, fresh files for SQLite); it
never touches other data.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import os
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final, Protocol

import psycopg
import sqlalchemy as sa
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import make_url

from pikku_celery.store import WorkflowStore

# Private, but importing it is what makes the floor's SQLite connection carry
# exactly the store's pragmas rather than a copy that could drift.
from pikku_celery.store.engine import _on_sqlite_connect

PG_URL_ENV: Final = "PIKKU_BENCH_PG_URL"
DEFAULT_PG_URL: Final = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_DATABASE: Final = "pikku_bench"
TARGET_RATIO: Final = 0.7
# Above this, the 1M timing is no longer "the same" as the 1k one: a B-tree
# lookup gains a level or two over that range, a scan gains a thousandfold.
FLAT_LIMIT: Final = 1.5
STATUSES: Final = ("scheduled", "running", "succeeded")
RESULT: Final = {"ok": 1}
# The parameters a transition's caller supplies; every other captured
# parameter is a constant of the statement (status names, ranks).
DYNAMIC: Final = frozenset({"step_id", "now", "history_id", "result", "attempt_no"})
ATTEMPTS_PER_BULK_STEP: Final = 4
STEPS_PER_BULK_RUN: Final = 10
BULK_CHUNK: Final = 250_000
WARMUP_STEPS: Final = 20
BLOCK_STEPS: Final = 50
# Smaller: the index probes have fewer steps, and need many turns to even out bursts.
PROBE_BLOCK_STEPS: Final = 10


def say(text: str = "") -> None:
    print(text, flush=True)


@dataclass(frozen=True)
class Settings:
    transitions: int
    rounds: int
    small_rows: int
    big_rows: int
    probe_steps: int
    profile: bool


# --- captured SQL -------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """One statement as the store handed it to the driver, ready to replay."""

    sql: str
    # A dict for psycopg's named style, a list for sqlite3's positional one.
    params: dict[str, Any] | list[Any]
    slots: tuple[tuple[Any, str], ...]

    def bind(self, values: Mapping[str, Any]) -> dict[str, Any] | list[Any]:
        params = self.params.copy()
        for slot, name in self.slots:
            params[slot] = values[name]
        return params


def capture(store: WorkflowStore, action: Callable[[], object]) -> list[Statement]:
    """The statements ``action`` makes the store send, in order."""
    seen: list[Statement] = []

    def listener(
        conn: sa.Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        if isinstance(parameters, Mapping):
            named = dict(parameters)
            seen.append(Statement(statement, named, tuple((k, k) for k in named if k in DYNAMIC)))
            return
        if context.compiled is not None:
            names = context.compiled.positiontup
        else:
            # The store's hot path sends SQL it compiled once: look its order up there.
            names = next(order for sql, _, order in store._compiled.values() if sql == statement)
        slots = tuple((i, name) for i, name in enumerate(names) if name in DYNAMIC)
        seen.append(Statement(statement, list(parameters), slots))

    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        action()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    return seen


def capture_transitions(store: WorkflowStore) -> dict[str, list[Statement]]:
    _, [step_id], _ = add_steps(store, 1, "capture")
    calls: dict[str, Callable[[], object]] = {
        "scheduled": lambda: store.set_step_scheduled(step_id),
        "running": lambda: store.set_step_running(step_id),
        "succeeded": lambda: store.set_step_result(step_id, RESULT),
    }
    return {status: capture(store, call) for status, call in calls.items()}


# --- databases ----------------------------------------------------------------


class Cursor(Protocol):
    @property
    def description(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...


class Connection(Protocol):
    def commit(self) -> None: ...

    def close(self) -> None: ...


class Floor:
    """The captured statements replayed through a bare DBAPI connection.

    A row a statement returns (the step's attempt number) feeds the
    statements after it, as in the store.
    """

    def __init__(
        self,
        conn: Connection,
        execute: Callable[[str, Any], Cursor],
        plan: dict[str, list[Statement]],
        now: Callable[[], Any],
    ) -> None:
        self._conn = conn
        self._execute = execute
        self._plan = plan
        self.now = now

    def transition(self, status: str, values: dict[str, Any]) -> None:
        for statement in self._plan[status]:
            cursor = self._execute(statement.sql, statement.bind(values))
            if cursor.description is not None:
                row = cursor.fetchone()
                if row is None:
                    raise RuntimeError(f"floor transition to {status} changed nothing")
                values["attempt_no"] = row[0]
            elif cursor.rowcount != 1:
                raise RuntimeError(f"floor transition to {status} missed a row")
        self._conn.commit()

    def close(self) -> None:
        self._conn.close()


class Target(Protocol):
    name: str

    def fresh(self, which: str) -> str: ...

    def now(self) -> Any: ...

    def floor(self, plan: dict[str, list[Statement]]) -> Floor: ...

    def explain(
        self, engine: sa.Engine, statement: Statement, values: Mapping[str, Any]
    ) -> list[str]: ...

    def drop(self) -> None: ...


def _conninfo(url: sa.URL) -> str:
    query = {key: value for key, value in url.query.items() if isinstance(value, str)}
    return make_conninfo(
        "",
        host=url.host,
        port=url.port,
        user=url.username,
        password=url.password,
        dbname=url.database,
        **query,
    )


class PgTarget:
    name = "postgresql"

    def __init__(self, url: str) -> None:
        parsed = make_url(url)
        if parsed.get_backend_name() not in ("postgresql", "postgres"):
            raise SystemExit(f"--pg-url must be a postgresql:// URL, not {parsed.drivername}://")
        if parsed.database in (self._database("main"), self._database("big")):
            raise SystemExit(
                f"--pg-url names {parsed.database!r}, a database the bench drops and "
                "recreates; point it at another database on the same server."
            )
        self._url = parsed.set(drivername="postgresql+psycopg")
        self._admin = _conninfo(parsed)
        self._created: set[str] = set()

    @staticmethod
    def _database(which: str) -> str:
        return BENCH_DATABASE if which == "main" else f"{BENCH_DATABASE}_{which}"

    def fresh(self, which: str) -> str:
        database = self._database(which)
        with psycopg.connect(self._admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {database}")
        self._created.add(database)
        return self._url.set(database=database).render_as_string(hide_password=False)

    def now(self) -> Any:
        return dt.datetime.now(dt.timezone.utc)

    def floor(self, plan: dict[str, list[Statement]]) -> Floor:
        # The store runs a one-statement transition in autocommit (atomic on its
        # own, one round trip); the floor does the same, or it would measure
        # BEGIN and COMMIT round trips the store does not make.
        conn = psycopg.connect(
            _conninfo(self._url.set(database=self._database("main"))), autocommit=True
        )
        cursor = conn.cursor()
        return Floor(conn, cursor.execute, plan, self.now)

    def explain(
        self, engine: sa.Engine, statement: Statement, values: Mapping[str, Any]
    ) -> list[str]:
        conn = engine.raw_connection()
        try:
            cursor = conn.cursor()
            # ANALYZE runs the statement, so the plan shown is the one taken;
            # the rollback leaves the data as it was.
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + statement.sql, statement.bind(values))
            lines = [str(row[0]) for row in cursor.fetchall()]
            conn.rollback()
        finally:
            conn.close()
        return lines

    def drop(self) -> None:
        with psycopg.connect(self._admin, autocommit=True) as conn:
            for database in sorted(self._created):
                conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        self._created.clear()


class SqliteTarget:
    name = "sqlite"

    def __init__(self, path: Path | None) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pikku-bench-")
            path = Path(self._tmp.name) / "bench.db"
        self.path = path
        for which in ("main", "big"):
            if self._path(which).exists():
                raise SystemExit(
                    f"{self._path(which)} already exists; give --sqlite-path a new file, "
                    "which the bench creates and deletes."
                )
        self._created: set[str] = set()

    def _path(self, which: str) -> Path:
        if which == "main":
            return self.path
        return self.path.with_name(f"{self.path.stem}-{which}{self.path.suffix}")

    def fresh(self, which: str) -> str:
        self._remove(which)
        self._created.add(which)
        return f"sqlite:///{self._path(which)}"

    def now(self) -> Any:
        # The text SQLAlchemy's SQLite DateTime writes for the store's naive UTC.
        return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None).isoformat(" ", "microseconds")

    def floor(self, plan: dict[str, list[Statement]]) -> Floor:
        conn = sqlite3.connect(self._path("main"))
        _on_sqlite_connect(conn, None)
        return Floor(conn, conn.cursor().execute, plan, self.now)

    def explain(
        self, engine: sa.Engine, statement: Statement, values: Mapping[str, Any]
    ) -> list[str]:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + statement.sql, tuple(statement.bind(values))
            ).all()
        return [str(row[3]) for row in rows]

    def drop(self) -> None:
        for which in sorted(self._created):
            self._remove(which)
        self._created.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _remove(self, which: str) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self._path(which)}{suffix}").unlink(missing_ok=True)


@contextmanager
def opened(target: Target, which: str = "main") -> Iterator[WorkflowStore]:
    store = WorkflowStore(target.fresh(which))
    try:
        store.init()
        yield store
    finally:
        store.close()


# --- workload -----------------------------------------------------------------


def add_steps(store: WorkflowStore, count: int, label: str) -> tuple[str, list[str], list[str]]:
    """A new run with ``count`` pending steps; returns the run id, step ids and names."""
    run_id = store.create_run("bench", {"label": label})
    names = [f"{label}-{i}" for i in range(count)]
    with store.transaction() as conn:
        states = [
            store.insert_step_state(run_id, name, "bench.rpc", {}, conn=conn) for name in names
        ]
    return run_id, [state.step_id for state in states], names


def store_transitions(store: WorkflowStore, step_ids: Sequence[str]) -> None:
    for step_id in step_ids:
        applied = (
            store.set_step_scheduled(step_id)
            and store.set_step_running(step_id)
            and store.set_step_result(step_id, RESULT)
        )
        if not applied:
            raise RuntimeError(f"a store transition of step {step_id} changed nothing")


def floor_transitions(floor: Floor, step_ids: Sequence[str]) -> None:
    for step_id in step_ids:
        for status in STATUSES:
            values = {"step_id": step_id, "now": floor.now(), "history_id": str(uuid.uuid4())}
            if status == "succeeded":
                values["result"] = json.dumps(RESULT, separators=(",", ":"))
            floor.transition(status, values)


def succeeded_attempts(store: WorkflowStore, run_id: str) -> int:
    return sum(1 for attempt in store.get_run_history(run_id) if attempt.status == "succeeded")


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


# --- throughput ---------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    database: str
    statements: int
    store_rates: list[float]
    floor_rates: list[float]

    @property
    def store(self) -> float:
        return statistics.median(self.store_rates)

    @property
    def floor(self) -> float:
        return statistics.median(self.floor_rates)

    @property
    def ratio(self) -> float:
        return self.store / self.floor

    @property
    def overhead_us(self) -> float:
        return (1 / self.store - 1 / self.floor) * 1e6


def measure_throughput(target: Target, settings: Settings) -> Throughput:
    steps_per_round = max(1, settings.transitions // len(STATUSES))
    transitions = steps_per_round * len(STATUSES)
    with opened(target) as store:
        plan = capture_transitions(store)
        floor = target.floor(plan)
        try:
            _, warm_store, _ = add_steps(store, WARMUP_STEPS, "warm-store")
            _, warm_floor, _ = add_steps(store, WARMUP_STEPS, "warm-floor")
            store_transitions(store, warm_store)
            floor_transitions(floor, warm_floor)
            store_rates: list[float] = []
            floor_rates: list[float] = []
            for round_no in range(settings.rounds):
                store_run, store_steps, _ = add_steps(store, steps_per_round, f"store{round_no}")
                floor_run, floor_steps, _ = add_steps(store, steps_per_round, f"floor{round_no}")
                spent = {"store": 0.0, "floor": 0.0}
                # Short alternating blocks, so a slow spell of the disk or a
                # checkpoint lands on both sides instead of on one.
                for block, lo in enumerate(range(0, steps_per_round, BLOCK_STEPS)):
                    sides: list[tuple[str, Callable[[], object]]] = [
                        (
                            "store",
                            partial(store_transitions, store, store_steps[lo : lo + BLOCK_STEPS]),
                        ),
                        (
                            "floor",
                            partial(floor_transitions, floor, floor_steps[lo : lo + BLOCK_STEPS]),
                        ),
                    ]
                    if (round_no + block) % 2:
                        sides.reverse()
                    for side, action in sides:
                        spent[side] += timed(action)
                for run_id in (store_run, floor_run):
                    if succeeded_attempts(store, run_id) != steps_per_round:
                        raise RuntimeError("a side did not bring every step to succeeded")
                store_rates.append(transitions / spent["store"])
                floor_rates.append(transitions / spent["floor"])
                say(
                    f"  round {round_no + 1}/{settings.rounds}: "
                    f"store {store_rates[-1]:,.0f}/s, floor {floor_rates[-1]:,.0f}/s"
                )
        finally:
            floor.close()
    return Throughput(
        database=target.name,
        statements=len(plan["running"]),
        store_rates=store_rates,
        floor_rates=floor_rates,
    )


def profile_store(target: Target, settings: Settings) -> None:
    """Where the store's time goes: cProfile over a run of transitions."""
    steps = max(1, settings.transitions // len(STATUSES))
    with opened(target) as store:
        _, warm, _ = add_steps(store, WARMUP_STEPS, "warm")
        store_transitions(store, warm)
        _, step_ids, _ = add_steps(store, steps, "profiled")
        profiler = cProfile.Profile()
        profiler.runcall(store_transitions, store, step_ids)
    stats = pstats.Stats(profiler)
    count = steps * len(STATUSES)
    total = sum(entry[2] for entry in stats.stats.values())  # type: ignore[attr-defined]
    driver = _driver_time(stats)
    say(f"  {count} transitions under cProfile (profiling inflates Python-heavy code):")
    say(f"    total                        {total / count * 1e6:8.1f} µs per transition")
    say(f"    in the driver (execute/fetch/commit/rollback) {driver / count * 1e6:8.1f} µs")
    say(f"    elsewhere (SQLAlchemy, store) {(total - driver) / count * 1e6:8.1f} µs")
    say("  top functions by own time:")
    for (path, line, name), entry in _top(stats, 12):
        calls, own, cumulative = entry[1], entry[2], entry[3]
        where = name if path == "~" else f"{_short(path)}:{line}({name})"
        say(
            f"    {own / count * 1e6:7.2f} µs own {cumulative / count * 1e6:8.2f} µs cum "
            f"{calls / count:5.1f} calls  {where}"
        )


def _short(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("site-packages", "pikku_celery"):
        if anchor in parts:
            index = parts.index(anchor)
            return "/".join(parts[index + (anchor == "site-packages") :])
    return Path(path).name


def _top(stats: pstats.Stats, limit: int) -> list[tuple[tuple[str, int, str], Any]]:
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    return sorted(table.items(), key=lambda item: item[1][2], reverse=True)[:limit]


def _driver_time(stats: pstats.Stats) -> float:
    """Cumulative time of the DBAPI calls that talk to the database."""
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    wanted = ("execute", "fetchone", "fetchall", "commit", "rollback")
    total = 0.0
    for (path, _line, name), entry in table.items():
        if path == "~":
            builtin = name.removeprefix("<method '").split("'")[0]
            if builtin in wanted and ("sqlite3.Cursor" in name or "sqlite3.Connection" in name):
                total += entry[3]
        elif (
            name in wanted
            and "psycopg" in Path(path).parts
            and Path(path).name in ("cursor.py", "connection.py")
        ):
            total += entry[3]
    return total


# --- index check --------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    history_rows: int
    step_rows: int
    transition_us: float
    get_step_state_us: float


@dataclass(frozen=True)
class IndexCheck:
    database: str
    small: Sample
    big: Sample
    plans: list[tuple[str, list[str]]]

    @property
    def transition_ratio(self) -> float:
        return self.big.transition_us / self.small.transition_us

    @property
    def get_ratio(self) -> float:
        return self.big.get_step_state_us / self.small.get_step_state_us

    @property
    def flat(self) -> bool:
        return self.transition_ratio <= FLAT_LIMIT and self.get_ratio <= FLAT_LIMIT

    @property
    def indexed(self) -> bool:
        return all(_uses_index(self.database, lines) for _, lines in self.plans)


def _uses_index(database: str, plan: list[str]) -> bool:
    if database == "postgresql":
        return not any("Seq Scan" in line for line in plan)
    return all(line.startswith("SEARCH") for line in plan)


class Bulk:
    """Loads runs, steps and attempts with one INSERT ... SELECT each, in the database."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.pg = engine.dialect.name == "postgresql"
        self.runs = self.steps = self.attempts = 0

    def _series(self) -> tuple[str, str]:
        if self.pg:
            return "", "generate_series(CAST(:lo AS BIGINT), CAST(:hi AS BIGINT)) AS n(i)"
        return (
            "WITH RECURSIVE n(i) AS (SELECT :lo UNION ALL SELECT i + 1 FROM n WHERE i < :hi) ",
            "n",
        )

    def _id(self, kind: int, number: str) -> str:
        # UUID-shaped and scattered like uuid4, so the indexes are as deep and
        # as fragmented as real ones, yet computable from the row number.
        if self.pg:
            return f"md5('{kind}-' || ({number}))::uuid::text"
        scattered = f"(({number}) * 2654435761) % 4294967296"
        return f"printf('%08x-0000-4000-800{kind}-%012x', {scattered}, {number})"

    def load(self, attempts: int) -> None:
        steps = max(1, attempts // ATTEMPTS_PER_BULK_STEP)
        runs = max(1, steps // STEPS_PER_BULK_RUN)
        attempts = steps * ATTEMPTS_PER_BULK_STEP
        prefix, series = self._series()
        r0, s0, h0 = self.runs, self.steps, self.attempts
        run_of_step = f":r0 + 1 + (i - :s0 - 1) % {runs}"
        step_of_attempt = f":s0 + 1 + (i - :h0 - 1) % {steps}"
        attempt_no = f"1 + (i - :h0 - 1) / {steps}"
        self._insert(
            "workflow_runs",
            f"{prefix}INSERT INTO workflow_runs (workflow_run_id, workflow, status, input) "
            f"SELECT {self._id(1, 'i')}, 'bench-bulk', 'succeeded', '{{}}' FROM {series}",
            {"lo": r0 + 1, "hi": r0 + runs},
        )
        self._insert(
            "workflow_step",
            f"{prefix}INSERT INTO workflow_step (workflow_step_id, workflow_run_id, "
            "step_name, status, result, current_attempt) "
            f"SELECT {self._id(2, 'i')}, {self._id(1, run_of_step)}, 'bulk-' || i, "
            f"'succeeded', '{{\"ok\": 1}}', {ATTEMPTS_PER_BULK_STEP} FROM {series}",
            {"lo": s0 + 1, "hi": s0 + steps, "r0": r0, "s0": s0},
        )
        for lo in range(h0 + 1, h0 + attempts + 1, BULK_CHUNK):
            self._insert(
                "workflow_step_history",
                f"{prefix}INSERT INTO workflow_step_history (history_id, "
                "workflow_step_id, status, attempt) "
                f"SELECT {self._id(3, 'i')}, {self._id(2, step_of_attempt)}, "
                f"CASE WHEN {attempt_no} = {ATTEMPTS_PER_BULK_STEP} "
                f"THEN 'succeeded' ELSE 'failed' END, {attempt_no} FROM {series}",
                {"lo": lo, "hi": min(lo + BULK_CHUNK - 1, h0 + attempts), "s0": s0, "h0": h0},
            )
        self.runs, self.steps, self.attempts = r0 + runs, s0 + steps, h0 + attempts
        self._settle()

    def _settle(self) -> None:
        """Do now the work the load leaves behind, so it does not land in a measurement."""
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if not self.pg:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                return
            conn.exec_driver_sql("VACUUM ANALYZE")
            try:
                conn.exec_driver_sql("CHECKPOINT")
            except sa.exc.DBAPIError:
                # Needs superuser or pg_checkpoint; without it the server
                # writes the load out in the background, a little noisier.
                conn.rollback()

    def _insert(self, table: str, sql: str, params: dict[str, int]) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text(sql), params)
            if self.pg:
                # The foreign-key checks of the next load are planned from these
                # statistics: left at a table's small size, they can choose a
                # scan per inserted row, and a million-row load takes minutes.
                conn.exec_driver_sql(f"ANALYZE {table}")


def count_rows(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        history = conn.exec_driver_sql("SELECT count(*) FROM workflow_step_history").scalar()
        steps = conn.exec_driver_sql("SELECT count(*) FROM workflow_step").scalar()
    return int(history or 0), int(steps or 0)


class Probe:
    """Timed calls against one database, made in blocks so two can take turns."""

    def __init__(self, store: WorkflowStore, steps: int, label: str) -> None:
        self.store = store
        warm_run, warm, warm_names = add_steps(store, WARMUP_STEPS, f"{label}-warm")
        store_transitions(store, warm)
        for name in warm_names:
            store.get_step_state(warm_run, name)
        self.run_id, self.step_ids, self.names = add_steps(store, steps, label)
        self.transition_times: list[float] = []
        self.get_times: list[float] = []

    def transitions(self, lo: int, hi: int) -> None:
        store = self.store
        for step_id in self.step_ids[lo:hi]:
            for call in (
                store.set_step_scheduled,
                store.set_step_running,
                partial(_set_result, store),
            ):
                start = time.perf_counter()
                call(step_id)
                self.transition_times.append(time.perf_counter() - start)

    def gets(self, lo: int, hi: int) -> None:
        for name in self.names[lo:hi]:
            # As many reads as transitions, so both medians rest on as many calls.
            for _ in STATUSES:
                start = time.perf_counter()
                self.store.get_step_state(self.run_id, name)
                self.get_times.append(time.perf_counter() - start)

    def sample(self) -> Sample:
        history_rows, step_rows = count_rows(self.store.engine)
        return Sample(
            history_rows=history_rows,
            step_rows=step_rows,
            transition_us=statistics.median(self.transition_times) * 1e6,
            get_step_state_us=statistics.median(self.get_times) * 1e6,
        )


def _set_result(store: WorkflowStore, step_id: str) -> bool:
    return store.set_step_result(step_id, RESULT)


def interleaved(probes: Sequence[Probe], steps: int) -> None:
    """Both databases measured in alternating blocks, in the same minutes.

    Timed one after the other, a slow spell of the machine would pass for a
    difference between the sizes.
    """
    for method in (Probe.transitions, Probe.gets):
        for block, lo in enumerate(range(0, steps, PROBE_BLOCK_STEPS)):
            for probe in probes if block % 2 == 0 else probes[::-1]:
                method(probe, lo, lo + PROBE_BLOCK_STEPS)


def query_plans(target: Target, store: WorkflowStore) -> list[tuple[str, list[str]]]:
    run_id, [captured, explained], names = add_steps(store, 2, "explain")
    [lookup] = capture(store, lambda: store.get_step_state(run_id, names[1]))
    transition = capture(store, lambda: store.set_step_running(captured))
    values = {
        "step_id": explained,
        "now": target.now(),
        "history_id": str(uuid.uuid4()),
        "attempt_no": 1,
    }
    plans = [("get_step_state: " + _head(lookup.sql), target.explain(store.engine, lookup, values))]
    for statement in transition:
        plans.append(
            ("transition: " + _head(statement.sql), target.explain(store.engine, statement, values))
        )
    return plans


def _head(sql: str) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= 60 else text[:57] + "..."


def measure_index(target: Target, settings: Settings) -> IndexCheck:
    probe = settings.probe_steps
    with opened(target, "main") as small_store, opened(target, "big") as big_store:
        # The probes add their own steps' attempt rows; the bulk load makes up the rest.
        own_rows = probe + WARMUP_STEPS
        Bulk(small_store.engine).load(max(ATTEMPTS_PER_BULK_STEP, settings.small_rows - own_rows))
        started = time.perf_counter()
        Bulk(big_store.engine).load(settings.big_rows - own_rows)
        loaded = time.perf_counter() - started
        say(f"  bulk-loaded {settings.big_rows:,} attempt rows in {loaded:.1f} s")
        probes = [Probe(small_store, probe, "small"), Probe(big_store, probe, "big")]
        interleaved(probes, probe)
        small, big = (one.sample() for one in probes)
        for one in (small, big):
            say(
                f"  {one.history_rows:,} attempt rows: transition {one.transition_us:,.1f} µs, "
                f"get_step_state {one.get_step_state_us:,.1f} µs"
            )
        plans = query_plans(target, big_store)
    return IndexCheck(database=target.name, small=small, big=big, plans=plans)


# --- report -------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        say("  ".join(cells))


def report(throughputs: Sequence[Throughput], checks: Sequence[IndexCheck]) -> None:
    if throughputs:
        say()
        say("Transitions per second (median of rounds; one transaction per transition)")
        table(
            (
                "database",
                "stmts/tr",
                "store/s",
                "floor/s",
                "store/floor",
                "target",
                "met",
                "µs/tr extra",
            ),
            [
                (
                    row.database,
                    str(row.statements),
                    f"{row.store:,.0f}",
                    f"{row.floor:,.0f}",
                    f"{row.ratio:.3f}",
                    f"{TARGET_RATIO:.2f}",
                    "yes" if row.ratio >= TARGET_RATIO else "NO",
                    f"{row.overhead_us:.1f}",
                )
                for row in throughputs
            ],
        )
    if not checks:
        return
    say()
    say("Index check (median µs per call)")
    rows: list[tuple[str, ...]] = []
    for check in checks:
        for sample_ in (check.small, check.big):
            rows.append(
                (
                    check.database,
                    f"{sample_.history_rows:,}",
                    f"{sample_.step_rows:,}",
                    f"{sample_.transition_us:.1f}",
                    f"{sample_.get_step_state_us:.1f}",
                )
            )
        rows.append(
            (check.database, "ratio", "", f"{check.transition_ratio:.2f}", f"{check.get_ratio:.2f}")
        )
    table(("database", "attempt rows", "step rows", "transition", "get_step_state"), rows)
    for check in checks:
        say()
        verdict = "every plan uses an index" if check.indexed else "A PLAN SCANS A TABLE"
        flat = "flat" if check.flat else f"NOT flat (limit {FLAT_LIMIT})"
        say(f"{check.database}, {check.big.history_rows:,} attempt rows: {verdict}; cost {flat}")
        for label, lines in check.plans:
            say(f"  {label}")
            for line in lines:
                say(f"    {line}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.store_bench",
        description="Store transitions per second against the raw-driver floor, "
        "and transition/get_step_state cost at 1k vs 1M attempt rows.",
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL,
        help=f"a PostgreSQL server to bench on (default: ${PG_URL_ENV} or {DEFAULT_PG_URL}); "
        f"the bench creates and drops its own databases {BENCH_DATABASE} and "
        f"{BENCH_DATABASE}_big there",
    )
    parser.add_argument(
        "--sqlite-path",
        type=Path,
        help="a new file for the SQLite database (default: one in a temporary directory); "
        "it and a -big sibling are deleted afterwards",
    )
    parser.add_argument("--transitions", type=int, help="transitions per side per round")
    parser.add_argument("--rounds", type=int, help="throughput rounds; the median is reported")
    parser.add_argument("--big-rows", type=int, help="attempt rows for the large index sample")
    parser.add_argument(
        "--quick", action="store_true", help="small numbers, for a smoke test (under a minute)"
    )
    parser.add_argument("--only", choices=("postgresql", "sqlite"), help="bench one database")
    parser.add_argument("--skip-index", action="store_true", help="only the throughput comparison")
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 when the store is below {TARGET_RATIO} of the floor or the index check fails",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile the store's transitions (cProfile)"
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    quick = bool(args.quick)
    settings = Settings(
        transitions=args.transitions or (600 if quick else 3000),
        rounds=args.rounds or 5,
        small_rows=1000,
        big_rows=args.big_rows or (100_000 if quick else 1_000_000),
        probe_steps=100 if quick else 300,
        profile=bool(args.profile),
    )
    if settings.transitions < len(STATUSES) or settings.rounds < 1:
        raise SystemExit("--transitions must be at least 3 and --rounds at least 1")
    if settings.big_rows < 10 * settings.small_rows:
        raise SystemExit(f"--big-rows must be at least {10 * settings.small_rows:,}")
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    targets: list[Target] = []
    try:
        if args.only in (None, "postgresql"):
            targets.append(PgTarget(args.pg_url))
        if args.only in (None, "sqlite"):
            targets.append(SqliteTarget(args.sqlite_path))
        started = time.perf_counter()
        throughputs: list[Throughput] = []
        checks: list[IndexCheck] = []
        for target in targets:
            say(f"{target.name}: {settings.rounds} rounds of {settings.transitions:,} transitions")
            throughputs.append(measure_throughput(target, settings))
            if settings.profile:
                profile_store(target, settings)
        if not args.skip_index:
            for target in targets:
                sizes = f"~{settings.small_rows:,} vs ~{settings.big_rows:,} attempt rows"
                say(f"{target.name}: index check, {sizes}")
                checks.append(measure_index(target, settings))
        report(throughputs, checks)
        say()
        say(f"done in {time.perf_counter() - started:.0f} s")
    finally:
        for target in targets:
            target.drop()
    met = all(row.ratio >= TARGET_RATIO for row in throughputs)
    flat = all(check.flat and check.indexed for check in checks)
    return 1 if args.check and not (met and flat) else 0


if __name__ == "__main__":
    sys.exit(main())
