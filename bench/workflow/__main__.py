"""A durable workflow against the same steps as a Celery chain, on one real worker.

Run from the project root::

    python -m bench.workflow            # 20 steps, 20 runs of each kind; 65-100 s here
    python -m bench.workflow --quick    # 5 runs of each kind, no pg_stat cross-check

Every kind runs a no-op step, ``inc(x) -> x + 1``, ``--steps`` times in a
row, on one ``celery worker --pool=prefork -c 2`` with Redis as the broker
and the mirror on PostgreSQL:

* ``workflow``: ``@pikku.workflow("seq")`` doing ``x = ctx.do("inc", inc, x)``
  in a loop, started with ``seq.start(steps)``;
* ``chain``: ``chain(inc.s(0), inc.s(), ...)`` of the same ``@pikku.step``
  task, published with ``pikku.run(chain, name="chain")``;
* ``celery``: the same chain of a plain ``@app.task``, which pikku does not
  mirror. It is not part of the target: it shows what Celery alone costs.

By default one run is in flight at a time (``--concurrent 1``): a run is
started, waited for, then the next one starts, so the figure is the latency
of a step, not the worker's throughput. The kinds take turns run by run, in
a rotating order, so a slow spell of the shared machine falls on every kind
alike. A run lasts from the moment the bench calls ``start``/``run`` until
the time the worker stamped on the write that completed the run
(``workflow_runs.updated_at``; same host, same clock), so the backoff of the
bench's polling does not inflate it. Two runs of each kind warm up first.

SQL statements are counted with a SQLAlchemy ``before_cursor_execute``
listener in every process that talks to the bench database: the bench
process (publishing: ``seq.start``, ``pikku.run``) and each pool child of
the worker (the mirror's signal handlers, the orchestrator, the step's
duplicate check). Each statement is labelled with the ``WorkflowStore``
method that sent it, and the time spent in it is summed (so is the time of
each commit). ``BEGIN`` and ``COMMIT``, which psycopg sends on its own, are
not statements here; transactions are counted separately (each autocommit
statement, each commit). The bench's own polling for the end of a run is
counted apart and left out of the per-step figures. CPU time comes from
``/proc`` for the worker's processes and the bench database's backends.

As a cross-check, ``pg_stat_database`` gives the transactions the server saw
for the bench database: over the whole timed phase, then over three more
untimed runs of each kind. Each read waits until idle backends have flushed
their statistics, which PostgreSQL 15 does within 10 s (``--stats-wait``).

The worker's app is ``bench.workflow.app``: ``celery -A bench.workflow.app
worker`` builds it from ``BENCH_*`` environment variables at import. The
bench creates and drops its own database (``pikku_bench_workflow``) and
flushes its Redis database first.
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
