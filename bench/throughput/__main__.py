"""Celery tasks per second with and without the pikku mirror, on real workers.

Run from the project root::

    python -m bench.throughput            # 2,000 tasks per run, best of 2, three pools
    python -m bench.throughput --quick    # 200 tasks, one round, prefork only

Plain Celery (with and without task events), Celery's SQLAlchemy and Redis result
backends, and the mirror on PostgreSQL (with and without task events) and SQLite, each run
with a fresh ``celery worker`` (``bench.throughput.app``) and publisher process
(``bench.throughput.publisher``). Scenarios, method, targets and figures:
``bench/throughput/results.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bench.harness.broker import DEFAULT_REDIS_URL
from bench.harness.options import comma_list, parser
from bench.harness.session import Session
from bench.throughput.app import MIRROR_DATABASE, RESULTS_DATABASE
from bench.throughput.pools import POOLS
from bench.throughput.report import report_delivery, report_pools, report_ratios, report_runs
from bench.throughput.runner import Bench, Settings, measure
from pikku_celery import WorkflowStore


def settings_from(argv: Sequence[str] | None) -> tuple[Settings, bool]:
    """The run's settings and whether ``--check`` was given."""
    options = parser(
        "throughput",
        "Celery tasks per second on real workers: plain, with Celery's database and Redis "
        "result backends, and with the pikku mirror; the mirror's lag and commits.",
        quick="200 tasks, one round, prefork",
        databases=(MIRROR_DATABASE, RESULTS_DATABASE),
        redis_url=DEFAULT_REDIS_URL,
        rounds=(2, 1, "the best is kept"),
        check="exit 1 when a target is missed, too",
    )
    options.size("--tasks", 2000, 200, "tasks per run")
    options.add_argument(
        "--pools",
        type=comma_list(POOLS),
        help="worker pools, some of prefork,threads,solo (default all three, --quick prefork); "
        "prefork runs every scenario, threads and solo (a), (b), (c) with no-op tasks",
    )
    args = options.read(argv)
    settings = Settings(
        tasks=args.tasks,
        rounds=args.rounds,
        pools=args.pools or (("prefork",) if args.quick else tuple(POOLS)),
        pg_url=args.pg_url,
        redis_url=args.redis_url,
    )
    return settings, bool(args.check)


def main(argv: Sequence[str] | None = None) -> int:
    settings, check = settings_from(argv)
    with Session("celery-bench", settings, (MIRROR_DATABASE, RESULTS_DATABASE)) as session:
        store = WorkflowStore(session.databases.url(MIRROR_DATABASE))
        store.init()
        store.close()
        runs = measure(Bench(settings, session))
        report_runs(runs, settings)
        if "prefork" in settings.pools:
            session.missed += report_ratios(runs)
        session.missed += report_delivery(runs)
        report_pools(runs, settings)
    return session.finish(check=check)


if __name__ == "__main__":
    sys.exit(main())
