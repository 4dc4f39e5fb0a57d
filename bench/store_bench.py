"""Store writes per second against the raw-driver floor, on PostgreSQL and SQLite.

Run from the project root::

    python -m bench.store_bench                    # every section, a few minutes
    python -m bench.store_bench --quick            # small numbers, under a minute
    python -m bench.store_bench --section batch    # only the group commits

Each floor is the very SQL the store sends, captured from the store itself
with a ``before_cursor_execute`` listener and replayed with fresh parameters
straight through psycopg 3 or the stdlib ``sqlite3`` module. What separates
the two is the store's own cost.

``single``: one transaction per transition (``set_step_*``), the floor
likewise.

``batch``: the mirror's group commits. A batch is B lone tasks, each a new
step (and its run), one transition running and succeeded coalesced (with
one counted delivery) and a run outcome, as the mirror's planner makes of a
task published, started and succeeded in one flush. Three paths take turns:
``apply_batch`` with the batches prebuilt; the mirror end to end (every
signal's event journaled, then ``flush()``: decoding, planning,
``apply_batch``, journal clean-up); and the floor, the DBAPI calls of one
``apply_batch`` replayed per batch in one transaction, ``executemany`` where
the store called it (psycopg 3 runs that in pipeline mode, under the store
as in the floor), with fresh ids and times prepared before the clock starts.
A task counts as three transitions: publish, running, succeeded.

``index``: one transition and one ``get_step_state`` with about a thousand
attempt rows in ``workflow_step_history`` and again with about a million,
and the query plans of the statements involved.

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
import re
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
from sqlalchemy.engine.interfaces import ExecuteStyle

from pikku_celery.integration.mirror import CeleryMirror, PublishedStep
from pikku_celery.store import WorkflowStore
from pikku_celery.store.attempts import NewRun
from pikku_celery.store.batch import MirrorBatch, NewStep, RunOutcome, StepTransition

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
SECTIONS: Final = ("single", "batch", "index")


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
    batch_size: int
    batch_tasks: int


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

    def batch_floor(self) -> BatchFloor: ...

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

    def batch_floor(self) -> BatchFloor:
        # A batch is a transaction, as under the store (psycopg opens it on the
        # first statement, the store's engine does the same).
        conn = psycopg.connect(_conninfo(self._url.set(database=self._database("main"))))
        return BatchFloor(conn)

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

    def batch_floor(self) -> BatchFloor:
        # The sqlite3 module's own transaction handling, as under SQLAlchemy:
        # BEGIN before the first write, COMMIT at commit().
        conn = sqlite3.connect(self._path("main"))
        _on_sqlite_connect(conn, None)
        return BatchFloor(conn)

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
    count = steps * len(STATUSES)
    say_profile(profiler, count, "transition", f"{count} transitions")


def say_profile(profiler: cProfile.Profile, count: int, unit: str, what: str) -> None:
    stats = pstats.Stats(profiler)
    total = sum(entry[2] for entry in stats.stats.values())  # type: ignore[attr-defined]
    driver = _driver_time(stats)
    say(f"  {what} under cProfile (profiling inflates Python-heavy code):")
    say(f"    total                        {total / count * 1e6:8.1f} µs per {unit}")
    say(
        "    in the driver (execute/executemany/fetch/commit/rollback) "
        f"{driver / count * 1e6:8.1f} µs"
    )
    say(f"    elsewhere (SQLAlchemy, store) {(total - driver) / count * 1e6:8.1f} µs")
    say("  top functions by own time:")
    for (path, line, name), entry in _top(stats, 15):
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
    wanted = ("execute", "executemany", "fetchone", "fetchall", "commit", "rollback")
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


# --- group commits ------------------------------------------------------------

# What the mirror writes for one lone Celery task, published, run and succeeded.
TASK_TRANSITIONS: Final = 3  # publish (scheduled), running, succeeded
TASK_INPUT: Final = {"args": [1], "kwargs": {}}
TASK_WIRE: Final = {"type": "task"}
WORKER: Final = "bench@localhost"
# Each side's runs carry their own workflow name, so each side's rows can be counted.
BATCH_SIDES: Final = ("apply_batch", "mirror", "floor")
# Ids and times inside parameter values, whole or within JSON text (rows sent as
# one JSON document): SQLite's stored text, or ISO 8601 as json.dumps writes it.
UUID_TEXT: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIME_TEXT: Final = re.compile(
    r"(\d{4}-\d{2}-\d{2})([ T])(\d{2}:\d{2}:\d{2}\.\d{6})((?:[+-]\d{2}:\d{2})?)"
)


@dataclass(frozen=True)
class Call:
    """One call the store made on its DBAPI cursor while applying a batch."""

    sql: str
    # executemany: a list of parameter sets; else one (a multi-row VALUES
    # statement from SQLAlchemy's insertmanyvalues is one execute).
    params: Any
    many: bool


def capture_calls(store: WorkflowStore, action: Callable[[], object]) -> list[Call]:
    """The DBAPI calls ``action`` makes the store send, in order."""
    seen: list[Call] = []

    def listener(
        conn: sa.Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        many = executemany and context.execute_style is ExecuteStyle.EXECUTEMANY
        seen.append(Call(statement, parameters, many))

    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        action()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    return seen


class Refresh:
    """Captured parameters made new: every id a fresh UUID (the same id twice, the
    same new one), every time moved by ``shift``; everything else as captured."""

    def __init__(self, shift: dt.timedelta) -> None:
        self.shift = shift
        self.ids: dict[str, str] = {}

    def _id(self, match: re.Match[str]) -> str:
        fresh = self.ids.get(match[0])
        if fresh is None:
            fresh = self.ids[match[0]] = str(uuid.uuid4())
        return fresh

    def _time(self, match: re.Match[str]) -> str:
        date, sep, clock, zone = match.groups()
        moved = dt.datetime.fromisoformat(f"{date}T{clock}") + self.shift
        return moved.isoformat(sep, "microseconds") + zone

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return TIME_TEXT.sub(self._time, UUID_TEXT.sub(self._id, value))
        if isinstance(value, dt.datetime):
            return value + self.shift
        if isinstance(value, list):
            return [self(item) for item in value]
        if isinstance(value, tuple):
            return tuple(self(item) for item in value)
        if isinstance(value, dict):
            return {key: self(item) for key, item in value.items()}
        return value


class BatchFloor:
    """Captured batch calls replayed through a bare DBAPI connection, one transaction
    per batch. ``cursor.executemany`` where the store called it: psycopg 3 runs it
    in pipeline mode, as it does under the store."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._cursor = conn.cursor()

    def apply(self, calls: Sequence[Call]) -> None:
        cursor = self._cursor
        for call in calls:
            if call.many:
                cursor.executemany(call.sql, call.params)
            else:
                cursor.execute(call.sql, call.params)
                if cursor.description is not None:
                    cursor.fetchall()
        self._conn.commit()

    def close(self) -> None:
        self._conn.close()


def encoded(store: WorkflowStore, value: Any) -> str:
    return store.codec.encode(value, "bench value")


def lone_task_batch(store: WorkflowStore, workflow: str, step_ids: Sequence[str]) -> MirrorBatch:
    """What the mirror's planner makes of lone tasks published, started and succeeded
    in one batch: a new step (with its run), one coalesced transition, one outcome."""
    data, wire, result = (
        encoded(store, TASK_INPUT),
        encoded(store, TASK_WIRE),
        encoded(store, RESULT),
    )
    batch = MirrorBatch()
    for step_id in step_ids:
        published = dt.datetime.now(dt.timezone.utc)
        started = published + dt.timedelta(microseconds=100)
        ended = started + dt.timedelta(microseconds=100)
        batch.steps.append(
            NewStep(
                run_id=step_id,
                step_id=step_id,
                step_name="task",
                rpc_name=workflow,
                data_json=data,
                at=published,
                run_workflow=workflow,
                run_input_json=data,
                run_wire_json=wire,
            )
        )
        batch.transitions.append(
            StepTransition(
                step_id=step_id,
                attempt=1,
                status="succeeded",
                at=ended,
                running_at=started,
                ended_at=ended,
                result_json=result,
                task_id=step_id,
                worker=WORKER,
                pid=os.getpid(),
                reason="first",
                delivery_ids=(str(uuid.uuid4()),),
            )
        )
        batch.outcomes.append(RunOutcome(step_id, step_id, "complete", ended))
    return batch


def new_ids(count: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(count)]


def published_steps(workflow: str, count: int) -> list[PublishedStep]:
    """What a publisher hands the mirror for ``count`` lone tasks."""
    return [
        PublishedStep(
            run_id=step_id,
            step_id=step_id,
            step_name="task",
            rpc_name=workflow,
            data=TASK_INPUT,
            new_run=NewRun(workflow, TASK_INPUT, TASK_WIRE),
        )
        for step_id in new_ids(count)
    ]


def mirror_tasks(mirror: CeleryMirror, steps: Sequence[PublishedStep]) -> None:
    """Every signal's event journaled, then one flush: the whole path to COMMIT."""
    pid = os.getpid()
    for step in steps:
        mirror.published(step)
        mirror.started(step.step_id, 1, worker=WORKER, pid=pid)
        mirror.succeeded(step.run_id, step.step_id, 1, RESULT)
    if not mirror.flush():
        raise RuntimeError("the mirror could not flush its journal")


def apply_batches(store: WorkflowStore, batches: Sequence[MirrorBatch]) -> None:
    for batch in batches:
        result = store.apply_batch(batch)
        if result.missing:
            raise RuntimeError(f"apply_batch missed {len(result.missing)} steps")


def completed_runs(store: WorkflowStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT workflow, count(*) FROM workflow_runs WHERE status = 'completed' "
            "GROUP BY workflow"
        ).all()
    return {str(workflow): int(count) for workflow, count in rows}


def side_workflow(side: str) -> str:
    return f"bench.{side}"


@dataclass(frozen=True)
class BatchPlan:
    """The floor's template: one batch's calls, and when its values were made."""

    calls: list[Call]
    made: dt.datetime

    def fresh(self) -> list[Call]:
        refresh = Refresh(dt.datetime.now(dt.timezone.utc) - self.made)
        return [Call(call.sql, refresh(call.params), call.many) for call in self.calls]


def capture_batch(store: WorkflowStore, size: int) -> BatchPlan:
    made = dt.datetime.now(dt.timezone.utc)
    batch = lone_task_batch(store, side_workflow("floor"), new_ids(size))
    calls = capture_calls(store, partial(apply_batches, store, [batch]))
    return BatchPlan(calls, made)


def mirror_statements(store: WorkflowStore, mirror: CeleryMirror, size: int) -> list[str]:
    steps = published_steps(side_workflow("mirror"), size)
    return [call.sql for call in capture_calls(store, partial(mirror_tasks, mirror, steps))]


@dataclass(frozen=True)
class BatchThroughput:
    database: str
    batch_size: int
    statements: int
    rates: dict[str, list[float]]  # tasks per second, per side and round

    def tasks(self, side: str) -> float:
        return statistics.median(self.rates[side])

    def ratio(self, side: str) -> float:
        return self.tasks(side) / self.tasks("floor")

    def overhead_us(self, side: str) -> float:
        return (1 / self.tasks(side) - 1 / self.tasks("floor")) * 1e6

    @property
    def met(self) -> bool:
        return self.ratio("apply_batch") >= TARGET_RATIO


def measure_batches(target: Target, settings: Settings) -> BatchThroughput:
    size = settings.batch_size
    batches = max(1, settings.batch_tasks // size)
    tasks = batches * size
    with opened(target) as store, tempfile.TemporaryDirectory(prefix="pikku-journal-") as journal:
        mirror = CeleryMirror(
            store, journal_dir=journal, batch_size=size * TASK_TRANSITIONS, background=False
        )
        floor = target.batch_floor()
        try:
            plan = capture_batch(store, size)
            sent = mirror_statements(store, mirror, size)
            if sent != [call.sql for call in plan.calls]:
                say("  note: the mirror's flush sends other statements than apply_batch here")
            # Warm-up: a batch per side outside the rounds.
            apply_batches(store, [lone_task_batch(store, "bench.warm", new_ids(size))])
            floor.apply(plan.fresh())
            mirror_tasks(mirror, published_steps("bench.warm", size))
            rates: dict[str, list[float]] = {side: [] for side in BATCH_SIDES}
            for round_no in range(settings.rounds):
                # Made before the clock starts: the store's batches as the planner
                # hands them over, the floor's calls with fresh values, the mirror's
                # steps as the publisher's signal handler has them.
                store_batches = [
                    lone_task_batch(store, side_workflow("apply_batch"), new_ids(size))
                    for _ in range(batches)
                ]
                floor_batches = [plan.fresh() for _ in range(batches)]
                mirror_batches = [
                    published_steps(side_workflow("mirror"), size) for _ in range(batches)
                ]
                before = completed_runs(store)
                spent = dict.fromkeys(BATCH_SIDES, 0.0)
                for block in range(batches):
                    actions: list[tuple[str, Callable[[], object]]] = [
                        (
                            "apply_batch",
                            partial(apply_batches, store, store_batches[block : block + 1]),
                        ),
                        ("mirror", partial(mirror_tasks, mirror, mirror_batches[block])),
                        ("floor", partial(floor.apply, floor_batches[block])),
                    ]
                    # Each side takes each place in turn, so a slow spell of the
                    # disk or a checkpoint lands on every side alike.
                    turn = (round_no + block) % len(actions)
                    for side, action in actions[turn:] + actions[:turn]:
                        spent[side] += timed(action)
                after = completed_runs(store)
                for side in BATCH_SIDES:
                    done = after.get(side_workflow(side), 0) - before.get(side_workflow(side), 0)
                    if done != tasks:
                        raise RuntimeError(f"{side} completed {done} of {tasks} runs")
                    rates[side].append(tasks / spent[side])
                say(
                    f"  round {round_no + 1}/{settings.rounds}: "
                    + ", ".join(f"{side} {rates[side][-1]:,.0f} tasks/s" for side in BATCH_SIDES)
                )
        finally:
            floor.close()
            mirror.close()
    return BatchThroughput(
        database=target.name, batch_size=size, statements=len(plan.calls), rates=rates
    )


def profile_batches(target: Target, settings: Settings) -> None:
    """Where apply_batch's time goes: cProfile over prebuilt batches."""
    size = settings.batch_size
    batches = max(1, settings.batch_tasks // size)
    with opened(target) as store:
        apply_batches(store, [lone_task_batch(store, "bench.warm", new_ids(size))])
        work = [lone_task_batch(store, "bench.profiled", new_ids(size)) for _ in range(batches)]
        profiler = cProfile.Profile()
        profiler.runcall(apply_batches, store, work)
    say_profile(profiler, batches * size, "task", f"{batches} batches of {size} tasks")


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


def report_batches(rows: Sequence[BatchThroughput]) -> None:
    say()
    say(
        "Group commits: lone tasks per second (median of rounds; one transaction per "
        f"batch; {TASK_TRANSITIONS} transitions per task: publish, running, succeeded)"
    )
    lines: list[tuple[str, ...]] = []
    for row in rows:
        floor = row.tasks("floor")
        for side in ("apply_batch", "mirror"):
            ratio = row.ratio(side)
            gated = side == "apply_batch"
            lines.append(
                (
                    row.database,
                    side if gated else "mirror+journal",
                    str(row.batch_size),
                    str(row.statements),
                    f"{row.tasks(side):,.0f}",
                    f"{row.tasks(side) * TASK_TRANSITIONS:,.0f}",
                    f"{floor:,.0f}",
                    f"{floor * TASK_TRANSITIONS:,.0f}",
                    f"{ratio:.3f}",
                    f"{TARGET_RATIO:.2f}" if gated else "-",
                    ("yes" if ratio >= TARGET_RATIO else "NO") if gated else "-",
                    f"{row.overhead_us(side):.1f}",
                )
            )
    table(
        (
            "database",
            "path",
            "batch",
            "calls/batch",
            "tasks/s",
            "trans/s",
            "floor tasks/s",
            "floor trans/s",
            "path/floor",
            "target",
            "met",
            "µs/task extra",
        ),
        lines,
    )


def report(
    throughputs: Sequence[Throughput],
    batch_rows: Sequence[BatchThroughput],
    checks: Sequence[IndexCheck],
) -> None:
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
    if batch_rows:
        report_batches(batch_rows)
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
        description="Store writes per second against the raw-driver floor, one "
        "transition per transaction and in the mirror's group commits, and "
        "transition/get_step_state cost at 1k vs 1M attempt rows.",
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
    parser.add_argument(
        "--section",
        choices=("all", *SECTIONS),
        default="all",
        help="single: one transaction per transition (set_step_*); batch: group commits "
        "(apply_batch and the mirror, as the mirror writes); index: 1k vs 1M attempt rows "
        "(default: all)",
    )
    parser.add_argument("--transitions", type=int, help="transitions per side per round")
    parser.add_argument("--batch-size", type=int, help="lone tasks per group commit (default 100)")
    parser.add_argument("--tasks", type=int, help="lone tasks per side per round (batch)")
    parser.add_argument("--rounds", type=int, help="throughput rounds; the median is reported")
    parser.add_argument("--big-rows", type=int, help="attempt rows for the large index sample")
    parser.add_argument(
        "--quick", action="store_true", help="small numbers, for a smoke test (under a minute)"
    )
    parser.add_argument("--only", choices=("postgresql", "sqlite"), help="bench one database")
    parser.add_argument(
        "--skip-index", action="store_true", help="leave the index check out of --section all"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 when the store is below {TARGET_RATIO} of the floor or the index check fails",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile the store's transitions and apply_batch (cProfile)",
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
        batch_size=args.batch_size or 100,
        batch_tasks=args.tasks or (500 if quick else 3000),
    )
    if settings.transitions < len(STATUSES) or settings.rounds < 1:
        raise SystemExit("--transitions must be at least 3 and --rounds at least 1")
    if settings.batch_size < 2 or settings.batch_tasks < settings.batch_size:
        raise SystemExit("--batch-size must be at least 2 and --tasks at least --batch-size")
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
        sections = set(SECTIONS) if args.section == "all" else {args.section}
        if args.skip_index and args.section == "all":
            sections.discard("index")
        started = time.perf_counter()
        throughputs: list[Throughput] = []
        batch_rows: list[BatchThroughput] = []
        checks: list[IndexCheck] = []
        for target in targets if "single" in sections else ():
            say(f"{target.name}: {settings.rounds} rounds of {settings.transitions:,} transitions")
            throughputs.append(measure_throughput(target, settings))
            if settings.profile:
                profile_store(target, settings)
        for target in targets if "batch" in sections else ():
            tasks = settings.batch_tasks - settings.batch_tasks % settings.batch_size
            say(
                f"{target.name}: {settings.rounds} rounds of {tasks:,} lone tasks "
                f"in batches of {settings.batch_size}"
            )
            batch_rows.append(measure_batches(target, settings))
            if settings.profile:
                profile_batches(target, settings)
        if "index" in sections:
            for target in targets:
                sizes = f"~{settings.small_rows:,} vs ~{settings.big_rows:,} attempt rows"
                say(f"{target.name}: index check, {sizes}")
                checks.append(measure_index(target, settings))
        report(throughputs, batch_rows, checks)
        say()
        say(f"done in {time.perf_counter() - started:.0f} s")
    finally:
        for target in targets:
            target.drop()
    met = all(row.ratio >= TARGET_RATIO for row in throughputs) and all(
        row.met for row in batch_rows
    )
    flat = all(check.flat and check.indexed for check in checks)
    return 1 if args.check and not (met and flat) else 0


if __name__ == "__main__":
    sys.exit(main())
