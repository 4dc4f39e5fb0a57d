"""Celery tasks per second with and without the pikku mirror, on real workers.

Run from the project root::

    python -m bench.celery_bench            # 2,000 tasks per run, best of 2, three pools
    python -m bench.celery_bench --quick    # 200 tasks, one round, prefork only

Every run starts its own ``celery worker`` on Redis (``-P prefork -c 2`` unless
said otherwise; the app is ``bench.celery_app``) and a separate publisher
process (``bench.celery_publisher``), both built from the scenario's
environment, so no run carries another's signal handlers:

* (a) ``plain``: plain Celery tasks, no result backend, no task events;
* (a+e) ``plain_events``: (a) with ``worker_send_task_events`` and
  ``task_send_sent_event`` on;
* (b) ``dbbackend``: Celery's SQLAlchemy result backend on PostgreSQL
  (``task_track_started``, ``result_extended``);
* (c) ``pikku``: ``@pikku.step`` tasks mirrored into PostgreSQL, task events off;
* (c+e) ``pikku_events``: (c) with the two task-event settings on;
* (d) ``redisbackend``: Celery's Redis result backend (``task_track_started``,
  ``result_extended``);
* (s) ``pikku_sqlite``: the mirror's embedded default, a SQLite file.

Each with no-op tasks and with tasks that retry once; the threads and solo
pools run (a), (b) and (c) with no-op tasks. A task of (a), (b) or (d) counts as
done in ``task_postrun`` of its successful execution. A mirrored run counts as
done only when SQL shows every step ``succeeded``: once the worker has counted
its last task the publisher polls the mirror database, and the run ends at the
first poll that sees them all. Both processes warm up with a few tasks first.

For every run the bench reports CPU milliseconds per task by process
(publisher, worker main process, pool children, PostgreSQL, Redis), read from
``/proc``; for PostgreSQL scenarios the SQL commits per task (``xact_commit`` of
the scenario's database across the worker's life); and for mirrored runs what
the mirror says of its own delivery (``mirror.delivery_stats()``): events
appended and written, batches committed, and the lag from each event to the
commit of its batch, merged over the publisher and every worker process.

The bench creates and drops its own databases (``pikku_bench_mirror``,
``pikku_bench_results``) and flushes its own Redis database before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.celery_app import (
    BROKER_ENV,
    BY_KEY,
    DATABASE_ENV,
    LOCAL_ENV,
    MATRIX,
    MIRROR_DATABASE,
    RESULTS_DATABASE,
    SCENARIO_ENV,
    SCENARIOS,
    STATS_ENV,
    VARIANT_LABELS,
    VARIANTS,
    Scenario,
)
from bench.celery_runs import Run, check_mirror, clear_mirror, load_delivery
from bench.harness.broker import DEFAULT_REDIS_URL, REDIS_URL_ENV, flush
from bench.harness.cpu import PARTS
from bench.harness.postgres import DEFAULT_PG_URL, PG_URL_ENV, BenchDatabases
from bench.harness.report import fmt, say, table, verdict
from bench.harness.workers import clean_env, mirror_failures, run_module, running_worker
from pikku_celery import WorkflowStore

POOLS: Final = {
    "prefork": ("--pool=prefork", "-c", "2"),
    "threads": ("--pool=threads", "-c", "4"),
    "solo": ("--pool=solo",),
}
POOL_LABELS: Final = {"prefork": "prefork -c 2", "threads": "threads -c 4", "solo": "solo"}
# The scenarios the threads and solo pools run, no-op tasks only.
POOL_SCENARIOS: Final = ("plain", "dbbackend", "pikku")

TARGET_OF_PLAIN: Final = 0.8
AIM_OF_PLAIN: Final = 0.9
TARGET_OF_DBBACKEND: Final = 3.0
TARGET_LAG_P99: Final = 0.100
TARGET_COMMITS: Final = 0.3

PART_SHORT: Final = {
    "this process": "pub",
    "worker main": "wmain",
    "worker children": "wkids",
    "postgres": "pg",
    "redis": "redis",
    "other": "other",
}


@dataclass(frozen=True)
class Settings:
    tasks: int
    rounds: int
    pools: tuple[str, ...]
    pg_url: str
    redis_url: str


@dataclass
class Bench:
    """What a run needs from the driver."""

    settings: Settings
    databases: BenchDatabases
    tmp: Path
    problems: list[str]
    notes: set[str]
    count: int = 0

    def scenario_env(
        self, scenario: Scenario, database_url: str | None, stats_dir: Path
    ) -> dict[str, str]:
        local = str(self.tmp / "local")
        settings = {
            SCENARIO_ENV: scenario.key,
            BROKER_ENV: self.settings.redis_url,
            STATS_ENV: str(stats_dir),
            LOCAL_ENV: local,
            "PIKKU_SPOOL_DIR": local,
            "PIKKU_JOURNAL_DIR": local,
        }
        if database_url is not None:
            settings[DATABASE_ENV] = database_url
        return clean_env(settings)

    def database_url(self, scenario: Scenario) -> str | None:
        if scenario.database is None:
            return None
        if scenario.database == "sqlite":
            path = self.tmp / f"bench-{self.count}.db"
            url = f"sqlite:///{path}"
            store = WorkflowStore(url)
            store.init()
            store.close()
            return url
        url = self.databases.url(scenario.database)
        if scenario.mirror:
            clear_mirror(url)
        return url

    def run(self, scenario: Scenario, variant: str, pool: str, round_no: int, progress: str) -> Run:
        self.count += 1
        flush(self.settings.redis_url)
        database_url = self.database_url(scenario)
        stats_dir = self.tmp / f"stats-{self.count}"
        env = self.scenario_env(scenario, database_url, stats_dir)
        log = self.tmp / f"worker-{self.count}-{scenario.key}-{variant}-{pool}.log"
        run_key = f"bench:{scenario.key}:{variant}:{pool}:{round_no}"
        pg_database = scenario.database if scenario.database not in (None, "sqlite") else None
        before = self.databases.commits(pg_database) if pg_database else None
        with running_worker(
            "bench.celery_app", f"bench-{scenario.key}", POOLS[pool], env, env[BROKER_ENV], log
        ) as worker:
            args = ["--variant", variant, "--tasks", str(self.settings.tasks), "--run", run_key]
            args += ["--worker-pid", str(worker.pid)]
            output = run_module("bench.celery_publisher", args, env)
            report: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
            check = None
            if scenario.mirror:
                assert database_url is not None
                mirror_check = check_mirror(database_url, run_key, self.settings.tasks, variant)
                check = mirror_check.describe()
                if not mirror_check.ok:
                    self.problems.append(f"{run_key}: {check}")
        commits = None
        if pg_database is not None and before is not None:
            commits = self.databases.commits(pg_database) - before
        delivery = load_delivery(stats_dir) if scenario.mirror else None
        failures = mirror_failures(log)
        if failures:
            self.problems.append(
                f"{run_key}: the worker logged {len(failures)} mirror failures, "
                f"the first: {failures[0]}"
            )
        if report.get("forced_events") and not scenario.events:
            self.notes.add(
                "PikkuCelery switched the task events on; the bench turned them off for (c)."
            )
        run = Run(
            scenario.key,
            variant,
            pool,
            self.settings.tasks,
            report["elapsed"],
            report["worker_elapsed"],
            report["publish"],
            report["cpu"],
            commits,
            delivery,
            check,
        )
        line = (
            f"[{progress}] round {round_no + 1}  {POOL_LABELS[pool]:<12} {scenario.label:<24} "
            f"{VARIANT_LABELS[variant]:<10} {run.rate:8.1f} tasks/s"
        )
        if run.commits_per_task is not None:
            line += f"  {run.commits_per_task:.2f} commits/task"
        if delivery is not None:
            p99 = delivery.lag(0.99)
            line += f"  settle {run.settle * 1000:.0f} ms, lag p99 " + (
                f"{p99 * 1000:.1f} ms" if p99 is not None else "n/a"
            )
        if check is not None:
            line += f"  mirror: {check}"
        say(line)
        return run


def measure(bench: Bench) -> list[Run]:
    """Every timed run: the prefork matrix and SQLite, then the other pools."""
    plan: list[tuple[Scenario, str, str]] = []
    if "prefork" in bench.settings.pools:
        plan += [(scenario, variant, "prefork") for scenario in MATRIX for variant in VARIANTS]
        plan.append((BY_KEY["pikku_sqlite"], "noop", "prefork"))
    for pool in bench.settings.pools:
        if pool != "prefork":
            plan += [(BY_KEY[key], "noop", pool) for key in POOL_SCENARIOS]
    runs: list[Run] = []
    total = len(plan) * bench.settings.rounds
    for round_no in range(bench.settings.rounds):
        # Alternating the order keeps a slow start or a warm cache off one scenario.
        for scenario, variant, pool in plan if round_no % 2 == 0 else plan[::-1]:
            runs.append(bench.run(scenario, variant, pool, round_no, f"{len(runs) + 1}/{total}"))
    return runs


# --- the report -----------------------------------------------------------------


def best(runs: Sequence[Run], scenario: str, variant: str, pool: str = "prefork") -> Run | None:
    matching = [
        run
        for run in runs
        if run.scenario == scenario and run.variant == variant and run.pool == pool
    ]
    return max(matching, key=lambda run: run.rate) if matching else None


def ratio(top: Run | None, bottom: Run | None, measure: Callable[[Run], float]) -> float | None:
    if top is None or bottom is None or not measure(bottom):
        return None
    return measure(top) / measure(bottom)


def rate_of(run: Run) -> float:
    return run.rate


def ceiling_of(run: Run) -> float:
    return run.ceiling


def report_runs(runs: Sequence[Run], settings: Settings) -> None:
    say()
    say(
        f"Tasks per second, {settings.tasks:,} tasks per run, best of {settings.rounds}, "
        f"{os.cpu_count()} CPUs; CPU ms per task of the best run by process"
    )
    rows: list[list[str]] = []
    for pool in POOLS:
        for scenario in SCENARIOS:
            for variant in VARIANTS:
                top = best(runs, scenario.key, variant, pool)
                if top is None:
                    continue
                every = [
                    f"{run.rate:.0f}"
                    for run in runs
                    if (run.scenario, run.variant, run.pool) == (scenario.key, variant, pool)
                ]
                cpu = [f"{top.cpu.get(name, 0.0) / top.tasks * 1000:.2f}" for name in PARTS]
                rows.append(
                    [
                        pool,
                        scenario.label,
                        VARIANT_LABELS[variant],
                        f"{top.rate:.1f}",
                        "/".join(every),
                        *cpu,
                        f"{top.cpu_ms:.2f}",
                        f"{top.ceiling:.0f}",
                        fmt(top.commits_per_task),
                    ]
                )
    header = [
        "pool", "scenario", "variant", "tasks/s", "rounds",
        *(f"{PART_SHORT[name]} ms" for name in PARTS),
        "bench ms", "CPU-bound/s", "commits/task",
    ]  # fmt: skip
    table(header, rows)
    say(
        "(pub = publisher, wmain/wkids = worker main process/pool children, other = CPU "
        "spent outside the bench; 'bench ms' sums the bench's own processes and "
        "'CPU-bound/s' is what that cost allows with every CPU on it; commits/task is "
        "xact_commit of the scenario's database over the worker's life, warm-up included)"
    )


def report_ratios(runs: Sequence[Run]) -> list[str]:
    """The ratio table; returns the targets missed."""
    say()
    say(
        f"Ratios, prefork: c/a >= {TARGET_OF_PLAIN} (aim {AIM_OF_PLAIN}), the same with "
        f"task events on for both, c/b >= {TARGET_OF_DBBACKEND:g}; c/d reported"
    )
    missed: list[str] = []
    rows = []
    for variant in VARIANTS:
        got = {scenario.short: best(runs, scenario.key, variant) for scenario in SCENARIOS}
        of_plain = ratio(got["c"], got["a"], rate_of)
        with_events = ratio(got["c+e"], got["a+e"], rate_of)
        of_db = ratio(got["c"], got["b"], rate_of)
        of_redis = ratio(got["c"], got["d"], rate_of)
        for name, value, target in (
            ("c/a", of_plain, TARGET_OF_PLAIN),
            ("(c+e)/(a+e)", with_events, TARGET_OF_PLAIN),
            ("c/b", of_db, TARGET_OF_DBBACKEND),
        ):
            if verdict(value, target) == "MISSED":
                missed.append(f"{VARIANT_LABELS[variant]} {name} {value:.2f} < {target:g}")
        rows.append(
            [
                VARIANT_LABELS[variant],
                fmt(of_plain),
                verdict(of_plain, TARGET_OF_PLAIN),
                fmt(with_events),
                verdict(with_events, TARGET_OF_PLAIN),
                fmt(of_db),
                verdict(of_db, TARGET_OF_DBBACKEND),
                fmt(of_redis),
                fmt(ratio(got["c"], got["a"], ceiling_of)),
                fmt(ratio(got["c"], got["b"], ceiling_of)),
                fmt(ratio(got["s"], got["a"], rate_of)),
            ]
        )
    table(
        [
            "variant", "c/a", f">= {TARGET_OF_PLAIN}", "(c+e)/(a+e)", f">= {TARGET_OF_PLAIN}",
            "c/b", f">= {TARGET_OF_DBBACKEND:g}", "c/d", "c/a by CPU", "c/b by CPU", "s/a",
        ],
        rows,
    )  # fmt: skip
    return missed


def report_delivery(runs: Sequence[Run]) -> list[str]:
    """The mirror's lag and commits per task; returns the targets missed."""
    say()
    say(
        f"Mirror delivery of the best runs: lag from event to the COMMIT of its batch "
        f"(p99 <= {TARGET_LAG_P99 * 1000:.0f} ms), SQL commits per task (<= {TARGET_COMMITS})"
    )
    missed: list[str] = []
    rows = []
    for pool in POOLS:
        for scenario in SCENARIOS:
            if not scenario.mirror:
                continue
            for variant in VARIANTS:
                top = best(runs, scenario.key, variant, pool)
                if top is None or top.delivery is None:
                    continue
                d = top.delivery
                p99 = d.lag(0.99)
                commits = top.commits_per_task
                label = f"{pool} {scenario.short} {VARIANT_LABELS[variant]}"
                if verdict(p99, TARGET_LAG_P99, at_most=True) == "MISSED" and p99 is not None:
                    missed.append(
                        f"{label}: lag p99 {p99 * 1000:.1f} ms > {TARGET_LAG_P99 * 1000:.0f} ms"
                    )
                if verdict(commits, TARGET_COMMITS, at_most=True) == "MISSED":
                    missed.append(f"{label}: {commits:.3f} commits/task > {TARGET_COMMITS}")
                rows.append(
                    [
                        pool,
                        scenario.label,
                        VARIANT_LABELS[variant],
                        f"{top.settle * 1000:.0f}",
                        fmt(d.lag(0.5), ".1f", 1000),
                        fmt(p99, ".1f", 1000),
                        fmt(max(d.lags) if d.lags else None, ".1f", 1000),
                        verdict(p99, TARGET_LAG_P99, at_most=True),
                        str(d.processes),
                        f"{d.appended}/{d.written}" if d.available else "n/a",
                        fmt(top.batches_per_task, ".3f"),
                        fmt(commits, ".3f"),
                        verdict(commits, TARGET_COMMITS, at_most=True),
                    ]
                )
    table(
        [
            "pool", "scenario", "variant", "settle ms", "lag p50 ms", "lag p99 ms",
            "lag max ms", "p99", "procs", "appended/written", "batches/task",
            "commits/task", "commits",
        ],
        rows,
    )  # fmt: skip
    say(
        "(settle = SQL showing every step succeeded, minus the worker counting its last "
        "task; lags and batches are the timed run's, summed over the publisher and every "
        "worker process; n/a = the mirror has no delivery_stats())"
    )
    return missed


def report_pools(runs: Sequence[Run], settings: Settings) -> None:
    if len(settings.pools) < 2:
        return
    say()
    say("No-op tasks by pool: tasks/s (best), c/a and c/b")
    rows = []
    for pool in settings.pools:
        plain, dbbackend, pikku = (best(runs, key, "noop", pool) for key in POOL_SCENARIOS)
        rows.append(
            [
                POOL_LABELS[pool],
                *(fmt(run.rate if run else None, ".1f") for run in (plain, dbbackend, pikku)),
                fmt(ratio(pikku, plain, rate_of)),
                verdict(ratio(pikku, plain, rate_of), TARGET_OF_PLAIN),
                fmt(ratio(pikku, dbbackend, rate_of)),
                verdict(ratio(pikku, dbbackend, rate_of), TARGET_OF_DBBACKEND),
                fmt(pikku.cpu_ms if pikku else None),
            ]
        )
    table(
        [
            "pool", "(a)/s", "(b)/s", "(c)/s", "c/a", f">= {TARGET_OF_PLAIN}",
            "c/b", f">= {TARGET_OF_DBBACKEND:g}", "(c) bench ms",
        ],
        rows,
    )  # fmt: skip


def parse_pools(text: str) -> tuple[str, ...]:
    pools = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in pools if name not in POOLS]
    if unknown or not pools:
        raise argparse.ArgumentTypeError(f"pools are some of {', '.join(POOLS)}")
    return pools


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.celery_bench",
        description="Celery tasks per second on real workers: plain, with Celery's database "
        "and Redis result backends, and with the pikku mirror; the mirror's lag and commits.",
    )
    parser.add_argument("--tasks", type=int, help="tasks per run (default 2000, --quick 200)")
    parser.add_argument(
        "--rounds", type=int, help="rounds; the best is kept (default 2, --quick 1)"
    )
    parser.add_argument(
        "--pools",
        type=parse_pools,
        help="worker pools, some of prefork,threads,solo (default all three, --quick prefork); "
        "prefork runs every scenario, threads and solo (a), (b), (c) with no-op tasks",
    )
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG_URL,
        help=f"an existing PostgreSQL database to connect to (default ${PG_URL_ENV}, "
        f"else {DEFAULT_PG_URL}); "
        f"the bench creates and drops {MIRROR_DATABASE!r} and {RESULTS_DATABASE!r} on its server",
    )
    parser.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS_URL,
        help=f"the broker and Redis result backend (default ${REDIS_URL_ENV}, "
        f"else {DEFAULT_REDIS_URL}); "
        "this database is flushed",
    )
    parser.add_argument("--quick", action="store_true", help="200 tasks, one round, prefork")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed, too")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings(
        tasks=args.tasks or (200 if args.quick else 2000),
        rounds=args.rounds or (1 if args.quick else 2),
        pools=args.pools or (("prefork",) if args.quick else tuple(POOLS)),
        pg_url=args.pg_url,
        redis_url=args.redis_url,
    )
    if settings.tasks < 1 or settings.rounds < 1:
        raise SystemExit("--tasks and --rounds must be at least 1")
    started = time.perf_counter()
    databases = BenchDatabases(settings.pg_url, (MIRROR_DATABASE, RESULTS_DATABASE))
    databases.create()
    problems: list[str] = []
    notes: set[str] = set()
    missed: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="celery-bench-"))
    try:
        store = WorkflowStore(databases.url(MIRROR_DATABASE))
        store.init()
        store.close()
        bench = Bench(settings, databases, tmp, problems, notes)
        runs = measure(bench)
        report_runs(runs, settings)
        if "prefork" in settings.pools:
            missed += report_ratios(runs)
        missed += report_delivery(runs)
        report_pools(runs, settings)
    finally:
        flush(settings.redis_url)
        databases.drop()
        shutil.rmtree(tmp, ignore_errors=True)
    say()
    for note in sorted(notes):
        say(f"NOTE: {note}")
    for target in missed:
        say(f"TARGET MISSED: {target}")
    for problem in problems:
        say(f"MIRROR PROBLEM: {problem}")
    say(f"done in {time.perf_counter() - started:.0f} s")
    return 1 if problems or (args.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
