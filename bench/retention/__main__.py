"""Retiring finished runs: the store's batched DELETE on the plain layout against the same
runs on the partitioned layout (``pikku-celery db upgrade --layout partitioned``).

Run from the project root, as root (it makes a PostgreSQL server of its own)::

    python -m bench.retention                 # 100,000 runs over 10 days retired, 2 days kept
    python -m bench.retention --quick         # 5,000 runs: a smoke test

One server holds three databases with the same finished lone tasks, spread over the same
days: the first is filled (``fill.py``), the two others are copies of it
(``CREATE DATABASE ... TEMPLATE``), then laid out by day by the store itself
(``store.partitions.convert()``; its cost is reported apart, paid once). Side A retires
the expired runs on the plain layout as the store does: ``prune`` (runs, with their steps
and attempts by cascade, 500 a transaction), the delivery ledger's expiry and the results'
expiry, then the VACUUM those DELETEs call for. Side B does the same on the partitioned
layout, where ``prune`` drops the whole expired days' partitions first and deletes what is
left. Side C is the workers' upkeep on the partitioned layout instead,
``store.partitions.keep(retention=...)``. Each step reports its wall time, the WAL it
wrote, the bytes of the tables and indexes before and after, and the dead row versions it
left. Method and figures: ``README.md`` here.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import FrameType
from typing import Final

import sqlalchemy as sa

from bench.ceiling.cluster import OwnCluster
from bench.harness.options import parser
from bench.harness.report import say
from bench.retention.fill import Spread, fill
from bench.retention.measure import Meter, Step
from bench.retention.report import report
from pikku_celery import WorkflowStore
from pikku_celery.schema.partitions import PARTITIONED_TABLES, default_rows, partition_days
from pikku_celery.store.day_partitions import KeptDays

DEFAULT_PORT: Final = 5497
CLUSTER: Final = "pikku_retention"
#: The plain layout (side A), and the copies laid out by day (sides B and C).
PLAIN: Final = "pikku_retention"
PRUNED: Final = "pikku_retention_pruned"
KEPT: Final = "pikku_retention_kept"
#: The tables a retired run has rows in (the results too), every partition of each.
TABLES: Final = (*PARTITIONED_TABLES, "pikku_celery_results")
SCHEMA: Final = "public"


@dataclass(frozen=True)
class Days:
    """The days of the runs: ``days`` retired, then ``keep`` kept, ending at today."""

    today: dt.datetime  # UTC midnight
    days: int
    keep: int

    @property
    def start(self) -> dt.datetime:
        return self.today - dt.timedelta(days=self.days + self.keep)

    @property
    def cutoff(self) -> dt.datetime:
        return self.start + dt.timedelta(days=self.days)


def _options(argv: Sequence[str] | None) -> tuple[int, int, int, int]:
    options = parser(
        "retention",
        "Retiring finished runs on PostgreSQL: the store's batched DELETE (prune, the "
        "deliveries' and results' expiry, VACUUM) on the plain layout against the same on "
        "the partitioned layout, where whole days are dropped.",
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
        help="newer days of runs, as many a day, that stay (default 2; 0 leaves out side C)",
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


def _measured(
    store: WorkflowStore, meter: Meter, steps: list[Step], side: str
) -> Callable[[str, Callable[[], int]], Step]:
    """Measure an action as a step of ``side``, with the dead rows it left; kept in
    ``steps``."""

    def measure(what: str, action: Callable[[], int]) -> Step:
        step = meter.step(side, what, SCHEMA, TABLES, action)
        _flush_statistics(store)
        step = replace(step, dead_tuples=meter.dead_tuples(SCHEMA, TABLES))
        steps.append(step)
        return step

    return measure


def _retire(
    store: WorkflowStore, meter: Meter, cutoff: dt.datetime, side: str, prune: str
) -> list[Step]:
    """The store's retirement: ``prune``, the ledger's and the results' expiry, VACUUM."""
    steps: list[Step] = []
    measure = _measured(store, meter, steps, side)

    def expire_results() -> int:
        total = 0
        while gone := store.results.expire(cutoff, limit=1000):
            total += gone
        return total

    def vacuum() -> int:
        for table in TABLES:
            meter.run(f"VACUUM {SCHEMA}.{table}")
        return steps[0].runs

    measure(prune, lambda: store.prune(cutoff).runs)
    measure("`batches.prune_deliveries` (rows)", lambda: store.batches.prune_deliveries(cutoff))
    measure("`results.expire`, 1,000 a call (rows)", expire_results)
    measure("VACUUM of the seven tables", vacuum)
    return steps


def _runs_by_day(conn: sa.Connection, before: dt.date) -> dict[dt.date, int]:
    rows = conn.execute(
        sa.text(
            "SELECT run_day, count(*) FROM workflow_runs WHERE run_day < :before GROUP BY run_day"
        ),
        {"before": before},
    ).all()
    return {day: int(count) for day, count in rows}


def _pruned_side(
    store: WorkflowStore, conn: sa.Connection, meter: Meter, cutoff: dt.datetime
) -> list[Step]:
    """Side B: the same retirement on the partitioned layout; the prune's runs split into
    those that went with their day's partitions and those deleted."""
    by_day = _runs_by_day(conn, cutoff.date())
    steps = _retire(
        store,
        meter,
        cutoff,
        "B: partitioned",
        "`store.prune` (whole days dropped, the rest deleted)",
    )
    left = set(partition_days(conn))
    gone = [day for day in by_day if day not in left]
    dropped = sum(by_day[day] for day in gone)
    deleted = steps[0].runs - dropped
    steps[0] = replace(
        steps[0],
        what=f"`store.prune`: {len(gone)} days dropped ({dropped:,} runs), "
        f"{deleted:,} runs deleted",
    )
    say(
        f"B: store.prune retired {steps[0].runs:,} runs: {dropped:,} by dropping {len(gone)} days, "
        f"{deleted:,} by DELETE"
    )
    return steps


def _kept_side(store: WorkflowStore, meter: Meter, days: Days) -> list[Step]:
    """Side C: the workers' upkeep on the partitioned layout, with a retention of the kept
    days, as of today's midnight."""
    steps: list[Step] = []
    measure = _measured(store, meter, steps, "C: upkeep")
    retention = dt.timedelta(days=days.keep)
    kept: list[KeptDays] = []

    def keep() -> int:
        kept.append(store.partitions.keep(retention, now=days.today))
        return sum(day.rows.get("workflow_runs", 0) for day in kept[0].dropped)

    step = measure(f"`store.partitions.keep(retention={days.keep} days)`", keep)
    say(
        f"C: keep made {len(kept[0].made)} partitions, dropped {len(kept[0].dropped)} days "
        f"({step.runs:,} runs); rows in the default partitions: {kept[0].in_defaults or 'none'}"
    )
    return steps


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT")


def _prepare(admin: str) -> None:
    engine = _engine(admin)
    try:
        with engine.connect() as conn:
            # A VACUUM autovacuum started would land in a measured step; the bench runs it.
            conn.exec_driver_sql("ALTER SYSTEM SET autovacuum = off")
            conn.exec_driver_sql("SELECT pg_reload_conf()")
            conn.exec_driver_sql(f"CREATE DATABASE {PLAIN}")
    finally:
        engine.dispose()


def _filled(url: str, spread: Spread, cutoff: dt.datetime) -> None:
    """The plain database, filled, vacuumed and analysed; every connection to it closed."""
    store = WorkflowStore(url)
    engine = _engine(url)
    try:
        store.init()
        began = time.perf_counter()
        fill(store, spread)
        with engine.connect() as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
        say(
            f"filled: {spread.runs:,} finished lone tasks from {spread.start:%Y-%m-%d} to "
            f"{spread.end:%Y-%m-%d} in {time.perf_counter() - began:.0f} s; cutoff "
            f"{cutoff:%Y-%m-%d}, {store.count_prunable_runs(cutoff):,} runs before it"
        )
    finally:
        store.close()
        engine.dispose()


def _copied(admin: str) -> None:
    """The two databases laid out by day, as copies of the plain one, byte for byte."""
    engine = _engine(admin)
    try:
        with engine.connect() as conn:
            began = time.perf_counter()
            for name in (PRUNED, KEPT):
                conn.exec_driver_sql(f"CREATE DATABASE {name} TEMPLATE {PLAIN}")
            say(f"copied: {PRUNED} and {KEPT} in {time.perf_counter() - began:.1f} s")
    finally:
        engine.dispose()


def _converted(store: WorkflowStore, conn: sa.Connection, meter: Meter, side: str) -> Step:
    """``store.partitions.convert()`` measured as a step, then VACUUM ANALYZE as the
    plain database had after its fill (not measured)."""
    conversions = []

    def convert() -> int:
        conversions.append(store.partitions.convert())
        return 0

    step = meter.step(side, "", SCHEMA, TABLES, convert)
    conn.exec_driver_sql("VACUUM ANALYZE")
    done = conversions[0]
    moved = done.rows.get("workflow_runs", 0)
    defaults = default_rows(conn)
    say(
        f"{side}: {done.describe()}; in {step.seconds:.2f} s; rows in the default partitions: "
        f"{defaults or 'none'}"
    )
    return replace(
        step,
        what=f"`store.partitions.convert()`, {moved:,} runs, {len(done.days)} day partitions "
        "of 6 tables",
    )


def _run(admin: str, runs: int, days: Days) -> list[Step]:
    spread = Spread(
        days.start, days.days + days.keep, round(runs * (days.days + days.keep) / days.days)
    )
    base = admin.rsplit("/", 1)[0]
    _filled(f"{base}/{PLAIN}", spread, days.cutoff)
    _copied(admin)
    sides = {name: WorkflowStore(f"{base}/{name}") for name in (PLAIN, PRUNED, KEPT)}
    engines = {name: _engine(f"{base}/{name}") for name in sides}
    try:
        with (
            engines[PLAIN].connect() as plain,
            engines[PRUNED].connect() as pruned,
            engines[KEPT].connect() as kept,
        ):
            meters = {PLAIN: Meter(plain), PRUNED: Meter(pruned), KEPT: Meter(kept)}
            converted = _converted(sides[PRUNED], pruned, meters[PRUNED], "B: conversion, once")
            _converted(sides[KEPT], kept, meters[KEPT], "C: conversion, once")
            steps = _retire(
                sides[PLAIN],
                meters[PLAIN],
                days.cutoff,
                "A: DELETE",
                "`store.prune` (runs, steps, attempts; 500 runs a transaction)",
            )
            retired = {PLAIN: steps[0].runs}
            steps.append(converted)
            side_b = _pruned_side(sides[PRUNED], pruned, meters[PRUNED], days.cutoff)
            retired[PRUNED] = side_b[0].runs
            steps += side_b
            databases = {PLAIN: plain, PRUNED: pruned}
            if days.keep:
                side_c = _kept_side(sides[KEPT], meters[KEPT], days)
                retired[KEPT] = side_c[0].runs
                databases[KEPT] = kept
                steps += side_c
            else:
                say("C: left out: --keep 0 leaves no retention of a day or more to keep")
            _check(retired, databases)
        return steps
    finally:
        for store in sides.values():
            store.close()
        for engine in engines.values():
            engine.dispose()


def _check(retired: dict[str, int], databases: dict[str, sa.Connection]) -> None:
    """Every side retired the same runs, kept the same runs, and left no row in a default
    partition."""
    left = {
        name: int(conn.exec_driver_sql("SELECT count(*) FROM workflow_runs").scalar_one())
        for name, conn in databases.items()
    }
    say("runs left: " + ", ".join(f"{count:,} ({name})" for name, count in left.items()))
    # The results are not partitioned: what DELETE leaves of them is the same on every side.
    results = {
        name: Meter(conn).table_bytes(SCHEMA, ["pikku_celery_results"]) / 2**20
        for name, conn in databases.items()
    }
    say(
        "of the bytes after, pikku_celery_results's: "
        + ", ".join(f"{mib:.1f} MiB ({name})" for name, mib in results.items())
    )
    for name, conn in databases.items():
        if name != PLAIN and (defaults := default_rows(conn)):
            raise SystemExit(f"{name} holds rows in its default partitions: {defaults}")
    if len(set(left.values())) != 1 or len(set(retired.values())) != 1:
        raise SystemExit(f"the sides did not retire the same runs: {retired}")


def main(argv: Sequence[str] | None = None) -> int:
    runs, days, keep, port = _options(argv)
    signal.signal(signal.SIGTERM, _exit_on_term)
    today = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    say(f"load average at the start: {_load()} ({os.cpu_count()} CPUs)")
    with OwnCluster(port, name=CLUSTER) as cluster:
        say(f"PostgreSQL {cluster.version}, the bench's own, on port {port}")
        admin = cluster.url.replace("postgresql://", "postgresql+psycopg://")
        _prepare(admin)
        steps = _run(admin, runs, Days(today, days, keep))
    say()
    report(steps)
    say()
    say(f"load average at the end: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
