"""The client of the result backend bench: one measured run, in a process of its own.

``python -m bench.result_backend.client --measure M --count N`` is started by the
driver in the backend's environment (``bench.result_backend.app``) beside a running
worker; it warms up, measures, checks every value it got back, and prints one
JSON line. ``--measure expiry`` needs no worker: it loads expired results
straight into the backend's tables and times ``app.backend.cleanup()``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import sqlalchemy as sa
from celery import Celery, chord
from celery.result import AsyncResult

from bench.harness.broker import DEFAULT_REDIS_URL
from bench.harness.cpu import cpu_delta, cpu_snapshot
from bench.harness.mirror import succeeded_steps, wait_succeeded
from bench.harness.workers import BROKER_ENV, DATABASE_ENV
from bench.result_backend.app import (
    ADD,
    BACKEND_ENV,
    DATABASES,
    NOOP,
    TOTAL,
    build_app,
)

MEASURES: Final = ("drain", "latency", "chord", "expiry")
# Slow enough to mean the worker or the backend is stuck rather than slow.
MIN_TASKS_PER_SECOND: Final = 5
POLL: Final = 0.01
WARMUP: Final = {"drain": 20, "latency": 5, "chord": 10}
GET_TIMEOUT: Final = 10.0
CHORD_TIMEOUT: Final = 300.0
#: Results not yet expired that the cleanup must leave, per 100 expired ones.
KEPT_PER_100: Final = 1


def wait_ready(results: Sequence[AsyncResult[Any]], timeout: float) -> None:
    """Until the backend says every result is ready.

    Tasks finish about in publish order, so each look starts at the first
    result not yet seen ready and stops at the next one that is not: one
    backend read a look while the worker is behind, as many as it caught up.
    """
    deadline = time.monotonic() + timeout
    first = 0
    while first < len(results):
        while first < len(results) and results[first].ready():
            first += 1
        if first < len(results):
            if time.monotonic() > deadline:
                raise SystemExit(f"{first}/{len(results)} results ready after {timeout:.0f} s")
            time.sleep(POLL)


def drain(app: Celery, count: int, worker_pid: int, engine: sa.Engine | None) -> dict[str, Any]:
    """Publish ``count`` no-op tasks one ``apply_async`` each; the time until all are ready."""
    noop = app.tasks[NOOP]
    timeout = 60 + count / MIN_TASKS_PER_SECOND
    warm = [noop.apply_async() for _ in range(WARMUP["drain"])]
    wait_ready(warm, timeout)
    steps = succeeded_steps(engine) if engine is not None else 0
    before = cpu_snapshot(worker_pid, DATABASES)
    clock = time.perf_counter()
    results = [noop.apply_async() for _ in range(count)]
    published = time.perf_counter() - clock
    wait_ready(results, timeout)
    ready = time.perf_counter() - clock
    if engine is not None:
        wait_succeeded(engine, steps + count, timeout)
    elapsed = time.perf_counter() - clock
    after = cpu_snapshot(worker_pid, DATABASES)
    wrong = [r.id for r in results if r.result is not None or r.state != "SUCCESS"]
    if wrong:
        raise SystemExit(f"{len(wrong)} results are not SUCCESS/None, the first {wrong[0]}")
    return {
        "elapsed": elapsed,
        "ready": ready,
        "publish": published,
        "cpu": cpu_delta(before, after),
    }


def latency(app: Celery, count: int, worker_pid: int) -> dict[str, Any]:
    """``add.delay(i, i).get()`` ``count`` times in a row: each round trip's seconds."""
    add = app.tasks[ADD]
    for i in range(WARMUP["latency"]):
        add.delay(i, i).get(timeout=GET_TIMEOUT)
    before = cpu_snapshot(worker_pid, DATABASES)
    samples: list[float] = []
    for i in range(count):
        clock = time.perf_counter()
        value = add.delay(i, i).get(timeout=GET_TIMEOUT)
        samples.append(time.perf_counter() - clock)
        if value != 2 * i:
            raise SystemExit(f"add({i}, {i}) came back as {value!r}")
    after = cpu_snapshot(worker_pid, DATABASES)
    return {"samples": samples, "elapsed": sum(samples), "cpu": cpu_delta(before, after)}


def run_chord(app: Celery, size: int) -> Any:
    header = [app.signature(ADD, (i, 1)) for i in range(size)]
    return chord(header, app.signature(TOTAL)).apply_async().get(timeout=CHORD_TIMEOUT)


def chord_time(app: Celery, size: int, worker_pid: int) -> dict[str, Any]:
    """A chord of ``size`` ``add`` headers and a ``total`` body: apply to the body's value."""
    run_chord(app, WARMUP["chord"])
    before = cpu_snapshot(worker_pid, DATABASES)
    clock = time.perf_counter()
    value = run_chord(app, size)
    elapsed = time.perf_counter() - clock
    after = cpu_snapshot(worker_pid, DATABASES)
    expected = sum(i + 1 for i in range(size))
    if value != expected:
        raise SystemExit(f"the chord's body gave {value!r}, not {expected}")
    return {"elapsed": elapsed, "cpu": cpu_delta(before, after)}


# --- expiry ----------------------------------------------------------------------------

# What each backend's table holds for a finished task, enough for its cleanup to find.
# ``{age}`` is an interval; the rows are numbered by ``g`` from generate_series.
_LOADS: Final = {
    "db": (
        "celery_taskmeta",
        "INSERT INTO celery_taskmeta (id, task_id, status, result, date_done, name, retries, "
        "queue) SELECT nextval('task_id_sequence'), '{prefix}-' || g, 'SUCCESS', "
        "convert_to('{{\"result\": 2}}', 'UTF8'), "
        "(now() AT TIME ZONE 'UTC') - interval '{age}', 'rbench.add', 0, 'celery' "
        "FROM generate_series(1, {rows}) g",
    ),
    "pikku": (
        "pikku_celery_results",
        "INSERT INTO pikku_celery_results (task_id, status, attempt, meta, date_done, "
        "updated_at) SELECT '{prefix}-' || g, 'SUCCESS', 1, "
        "convert_to('{{\"result\": 2}}', 'UTF8'), now() - interval '{age}', "
        "now() - interval '{age}' FROM generate_series(1, {rows}) g",
    ),
    "dcr": (
        "django_celery_results_taskresult",
        "INSERT INTO django_celery_results_taskresult (task_id, status, content_type, "
        "content_encoding, result, date_done, date_created, task_name) "
        "SELECT '{prefix}-' || g, 'SUCCESS', 'application/json', 'utf-8', '2', "
        "now() - interval '{age}', now() - interval '{age}', 'rbench.add' "
        "FROM generate_series(1, {rows}) g",
    ),
}


def expiry(app: Celery, key: str, rows: int, database_url: str) -> dict[str, Any]:
    """``rows`` results a day past ``result_expires`` (and a few not yet): ``cleanup()``'s time."""
    if key not in _LOADS:
        raise SystemExit(f"the {key!r} backend has no cleanup to time")
    table, load = _LOADS[key]
    # The backend makes its own tables on first use (db+); a lookup is such a use.
    app.backend.get_task_meta("rbench-none")
    kept = max(1, rows * KEPT_PER_100 // 100)
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(load.format(prefix="old", age="2 days", rows=rows))
            conn.exec_driver_sql(load.format(prefix="new", age="1 minute", rows=kept))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            # What autovacuum would have done to a table that grew this big.
            conn.exec_driver_sql(f"VACUUM ANALYZE {table}")
        with engine.connect() as conn:
            loaded = int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())
        if loaded != rows + kept:
            raise SystemExit(f"{key}: {loaded} rows loaded, not {rows + kept}")
        before = cpu_snapshot(None, DATABASES)
        clock = time.perf_counter()
        app.backend.cleanup()
        elapsed = time.perf_counter() - clock
        after = cpu_snapshot(None, DATABASES)
        with engine.connect() as conn:
            left = int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())
    finally:
        engine.dispose()
    if left != kept:
        raise SystemExit(f"{key}: {left} rows left after cleanup(), not the {kept} unexpired")
    return {"elapsed": elapsed, "rows": rows, "cpu": cpu_delta(before, after)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    key = os.environ[BACKEND_ENV]
    database_url = os.environ.get(DATABASE_ENV)
    app, pikku = build_app(key, os.environ.get(BROKER_ENV) or DEFAULT_REDIS_URL, database_url)
    if args.measure == "expiry":
        assert database_url is not None
        return expiry(app, key, args.count, database_url)
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "latency": lambda: latency(app, args.count, args.worker_pid),
        "chord": lambda: chord_time(app, args.count, args.worker_pid),
    }
    if args.measure in runs:
        return runs[args.measure]()
    engine = None
    if pikku is not None:
        assert database_url is not None
        engine = sa.create_engine(database_url, pool_size=1)
    try:
        return drain(app, args.count, args.worker_pid, engine)
    finally:
        if engine is not None:
            engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.result_backend.client")
    parser.add_argument("--measure", choices=MEASURES, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--worker-pid", type=int, default=0)
    report = measure(parser.parse_args(argv))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
