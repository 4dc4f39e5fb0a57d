"""A durable workflow against the same steps as a Celery chain, on one real worker.

Run from the project root::

    python -m bench.workflow            # 20 steps, 20 runs of each kind; 65-100 s here
    python -m bench.workflow --quick    # 5 runs of each kind, no pg_stat cross-check

Three kinds run a no-op step ``--steps`` times in a row on one ``celery worker``
(``bench.workflow.app``) with the mirror on PostgreSQL: a ``@pikku.workflow``, a chain of
the same ``@pikku.step`` task run by ``pikku.run``, and the same chain of a plain task
(the floor). Wall time and SQL statements per step, with ``pg_stat_database`` as a
cross-check. What is measured, and the figures: ``bench/workflow/results.md``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from bench.harness.broker import DEFAULT_REDIS_URL
from bench.harness.options import parser
from bench.harness.postgres import BenchDatabases
from bench.harness.report import say
from bench.harness.session import Servers, Session
from bench.harness.workers import (
    BROKER_ENV,
    DATABASE_ENV,
    clean_env,
    mirror_failures,
    running_worker,
)
from bench.workflow.app import COUNT_DIR_ENV, build_app
from bench.workflow.crosscheck import cross_check
from bench.workflow.report import report, report_cross_check
from bench.workflow.runs import DATABASE, KINDS, Bench
from bench.workflow.sql_counts import SqlCounter
from bench.workflow.summary import KindSummary, check_runs
from bench.workflow.timeline import timeline

CONCURRENCY: Final = 2
WARMUP_RUNS: Final = 2
# PostgreSQL 15 flushes an idle backend's statistics within 10 s.
STATS_WAIT: Final = 11.0


def worker_env(database_url: str, redis_url: str, count_dir: Path) -> dict[str, str]:
    return clean_env(
        {BROKER_ENV: redis_url, DATABASE_ENV: database_url, COUNT_DIR_ENV: str(count_dir)}
    )


def measure(
    args: argparse.Namespace, database: BenchDatabases, work: Path
) -> tuple[bool, list[str]]:
    count_dir = work / "counts"
    count_dir.mkdir()
    log = work / "worker.log"
    probe = SqlCounter("other")
    probe.install()
    database_url = database.url(DATABASE)
    bench_app = build_app(args.redis_url, database_url)
    store = bench_app.pikku.store
    store.init()
    kinds = [kind for kind in KINDS if kind != "celery" or not args.no_floor]
    check = None
    try:
        env = worker_env(database_url, args.redis_url, count_dir)
        pool = ("--pool=prefork", "-c", str(CONCURRENCY))
        with running_worker(
            "bench.workflow.app", "wfbench", pool, env, args.redis_url, log
        ) as worker:
            bench = Bench(bench_app, probe, count_dir, args.steps, args.redis_url, worker.pid)
            say(f"worker ready; warming up with {WARMUP_RUNS} runs of each kind")
            for kind in kinds:
                bench.batch(kind, WARMUP_RUNS)
            checking = args.stats_wait > 0
            baseline = database.transactions(DATABASE, wait=args.stats_wait) if checking else 0
            before = bench.counts()
            clock = time.monotonic()
            tallies = bench.rounds(kinds, args.runs, args.concurrent)
            say(f"{args.runs} runs of each kind in {time.monotonic() - clock:.1f} s")
            if checking:
                check = cross_check(bench, database, before, baseline, args.stats_wait)
        servers = check.kinds if check is not None else {}
        summaries = {
            kind: KindSummary(tallies[kind], args.steps, servers.get(kind)) for kind in kinds
        }
        with probe.on_behalf("other"):
            timelines = {kind: timeline(store, summaries[kind]) for kind in ("workflow", "chain")}
            problems = check_runs(summaries, store)
        ok = report(summaries, timelines, args.concurrent)
        if check is not None:
            report_cross_check(check)
        failures = mirror_failures(log, "Traceback")
        if failures:
            problems.append(f"the worker logged {len(failures)} failures, first: {failures[0]}")
        return ok, problems
    finally:
        store.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    options = parser(
        "workflow",
        "Per-step wall time and SQL of a durable workflow vs a Celery chain.",
        quick="5 runs of each kind, no pg_stat cross-check",
        databases=(DATABASE,),
        redis_url=DEFAULT_REDIS_URL,
        check="exit 1 when the target is missed",
    )
    options.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    options.size("--runs", 20, 5, "measured runs of each kind")
    options.add_argument(
        "--concurrent", type=int, default=1, help="runs in flight at once (default 1)"
    )
    options.add_argument(
        "--stats-wait",
        type=float,
        help=f"seconds to let PostgreSQL flush statistics before each pg_stat_database "
        f"read (default {STATS_WAIT:g}; 0, the default with --quick, skips the cross-check)",
    )
    options.add_argument(
        "--no-floor", action="store_true", help="skip the plain Celery chain (the floor)"
    )
    args = options.read(argv)
    if args.stats_wait is None:
        args.stats_wait = 0.0 if args.quick else STATS_WAIT
    if args.steps < 2 or args.concurrent < 1:
        options.error("--steps must be 2 or more, --concurrent 1 or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Servers(pg_url=args.pg_url, redis_url=args.redis_url)
    with Session("pikku-wfbench", settings, (DATABASE,)) as session:
        session.keep_tmp = True
        ok, problems = measure(args, session.databases, session.tmp)
        session.problems += problems
        if not ok:
            session.missed.append("a workflow's per-step wall time or SQL (the table above)")
    if not session.problems:
        say("Every run returned its step count, every step succeeded once, no mirror failures.")
    return session.finish(check=bool(args.check))


if __name__ == "__main__":
    raise SystemExit(main())
