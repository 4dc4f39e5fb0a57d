"""Celery tasks per second with and without the pikku mirror, on real workers.

Run from the project root::

    python -m bench.throughput            # 2,000 tasks per run, best of 2, three pools
    python -m bench.throughput --quick    # 200 tasks, one round, prefork only

Every run starts its own ``celery worker`` on Redis (``-P prefork -c 2`` unless
said otherwise; the app is ``bench.throughput.app``) and a separate publisher
process (``bench.throughput.publisher``), both built from the scenario's
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
the mirror says of its own delivery (``mirror.stats()``): events
appended and written, batches committed, and the lag from each event to the
commit of its batch, merged over the publisher and every worker process.

The bench creates and drops its own databases (``pikku_bench_mirror``,
``pikku_bench_results``) and flushes its own Redis database before each run.
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
