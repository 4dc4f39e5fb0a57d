"""Retiring finished runs: the store's batched DELETE against dropping day partitions.

Run from the project root, as root (it makes a PostgreSQL server of its own)::

    python -m bench.retention                 # 100,000 runs over 10 days retired, 2 days kept
    python -m bench.retention --quick         # 5,000 runs: a smoke test

One database holds the same finished lone tasks twice: in the store's own tables
(``WorkflowStore.init``), and in a copy of the run tables RANGE-partitioned by the
run's day (``partitioned.py``). Side A retires the expired runs as the store does:
``prune`` (runs, with their steps and attempts by cascade, 500 a transaction), the
delivery ledger's expiry and the results' expiry, then the VACUUM those DELETEs call
for. Side B detaches and drops the expired days' partitions. Each step reports its
wall time, the WAL it wrote, the bytes of the tables and indexes before and after,
and (side A) the dead row versions left. Method and figures: ``README.md`` here.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import FrameType
from typing import Final

import sqlalchemy as sa

from bench.ceiling.cluster import OwnCluster
from bench.harness.options import parser
from bench.harness.report import say
from bench.retention import partitioned
from bench.retention.fill import Spread, fill
from bench.retention.measure import Meter, Step
from bench.retention.report import report
from pikku_celery import WorkflowStore

DEFAULT_PORT: Final = 5497
CLUSTER: Final = "pikku_retention"
DATABASE: Final = "pikku_retention"
TABLES: Final = tuple(partitioned.PARTED)


def _options(argv: Sequence[str] | None) -> tuple[int, int, int, int]:
    options = parser(
        "retention",
        "Retiring finished runs on PostgreSQL: the store's batched DELETE (prune, the "
        "deliveries' and results' expiry, VACUUM) against dropping day partitions.",
        quick="5,000 runs: a smoke test, not figures to quote",
    )
    options.size("--runs", 100_000, 5_000, "finished runs retired")
    options.add_argument(
        "--days", type=int, default=10, help="days the retired runs are spread over (default 10)"
    )
    options.add_argument(
        "--keep",
        type=int,
        default=2,
        help="newer days of runs, as many a day, that stay (default 2)",
    )
    options.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the port of the server the bench makes and drops (default {DEFAULT_PORT})",
    )
    args = options.read(argv)
    if args.days < 1 or args.keep < 0:
        options.error("--days must be at least 1 and --keep at least 0")
    return int(args.runs), int(args.days), int(args.keep), int(args.port)


def _exit_on_term(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds the with blocks: the bench's server is dropped.
    raise SystemExit(128 + signum)


def _load() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def _flush_statistics(store: WorkflowStore) -> None:
    """The store's connections closed: their backends report their dead rows as they exit."""
    store.engine.dispose()
    time.sleep(1.5)


def _delete_side(store: WorkflowStore, meter: Meter, cutoff: dt.datetime) -> list[Step]:
    steps: list[Step] = []

    def measure(what: str, action: Callable[[], int]) -> None:
        step = meter.step("A: DELETE", what, "public", TABLES, action)
        _flush_statistics(store)
        steps.append(replace(step, dead_tuples=meter.dead_tuples("public", TABLES)))

    def expire_results() -> int:
        total = 0
        while gone := store.results.expire(cutoff, limit=1000):
            total += gone
        return total

    def vacuum() -> int:
        for table in TABLES:
            meter.run(f"VACUUM public.{table}")
        return steps[0].runs

    measure(
        "`store.prune` (runs, steps, attempts; 500 runs a transaction)",
        lambda: store.prune(cutoff).runs,
    )
    measure("`batches.prune_deliveries` (rows)", lambda: store.batches.prune_deliveries(cutoff))
    measure("`results.expire`, 1,000 a call (rows)", expire_results)
    measure("VACUUM of the seven tables", vacuum)
    return steps


def _drop_side(conn: sa.Connection, meter: Meter, first: dt.date, days: int) -> Step:
    expired = meter.scalar(
        f"SELECT count(*) FROM {partitioned.SCHEMA}.workflow_runs "
        f"WHERE run_day < '{first + dt.timedelta(days=days)}'"
    )

    def drop() -> int:
        partitioned.retire_days(conn, first, days)
        return expired

    what = f"DETACH + DROP of {days} days' partitions of {len(TABLES)} tables"
    return meter.step("B: DROP", what, partitioned.SCHEMA, TABLES, drop)


def _prepare(url: str) -> None:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            # A VACUUM autovacuum started would land in a measured step; the bench runs it.
            conn.exec_driver_sql("ALTER SYSTEM SET autovacuum = off")
            conn.exec_driver_sql("SELECT pg_reload_conf()")
            conn.exec_driver_sql(f"CREATE DATABASE {DATABASE}")
    finally:
        engine.dispose()


def _run(url: str, runs: int, days: int, keep: int) -> list[Step]:
    today = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    start = today - dt.timedelta(days=days + keep)
    cutoff = start + dt.timedelta(days=days)
    spread = Spread(start, days + keep, round(runs * (days + keep) / days))
    store = WorkflowStore(url)
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        store.init()
        began = time.perf_counter()
        fill(store, spread)
        with engine.connect() as conn:
            partitioned.build(conn, start.date(), days + keep)
            partitioned.copy_rows(conn)
            conn.exec_driver_sql("VACUUM ANALYZE")
            meter = Meter(conn)
            say(
                f"filled: {spread.runs:,} finished lone tasks from {start:%Y-%m-%d} to "
                f"{spread.end:%Y-%m-%d}, twice, in {time.perf_counter() - began:.0f} s; "
                f"cutoff {cutoff:%Y-%m-%d}, {store.count_prunable_runs(cutoff):,} runs before it"
            )
            steps = _delete_side(store, meter, cutoff)
            steps.append(_drop_side(conn, meter, start.date(), days))
            left = {
                schema: meter.scalar(f"SELECT count(*) FROM {schema}.workflow_runs")
                for schema in ("public", partitioned.SCHEMA)
            }
            say(f"runs left: {left['public']:,} (A), {left[partitioned.SCHEMA]:,} (B)")
            if len(set(left.values())) != 1 or steps[0].runs != steps[-1].runs:
                raise SystemExit("the two sides did not retire the same runs")
        return steps
    finally:
        store.close()
        engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    runs, days, keep, port = _options(argv)
    signal.signal(signal.SIGTERM, _exit_on_term)
    say(f"load average at the start: {_load()} ({os.cpu_count()} CPUs)")
    with OwnCluster(port, name=CLUSTER) as cluster:
        say(f"PostgreSQL {cluster.version}, the bench's own, on port {port}")
        admin = cluster.url.replace("postgresql://", "postgresql+psycopg://")
        _prepare(admin)
        steps = _run(admin.rsplit("/", 1)[0] + f"/{DATABASE}", runs, days, keep)
    say()
    report(steps)
    say()
    say(f"load average at the end: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
