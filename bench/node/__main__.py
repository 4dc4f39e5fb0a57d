"""The mirror's one-flusher-per-node design against plain Celery, on a worker with one CPU.

Run from the project root, as root (it pins the PostgreSQL and Redis servers)::

    python -m bench.node            # 3,000 tasks, 5,000 calls, best of 2
    python -m bench.node --quick    # 500 tasks, 1,000 calls, one round

Two measures, each a ratio of the mirror to plain Celery in the same run, the
modes taking turns in an order reversed every other round:

1. **Drain**: a run's tasks (no-op, and tasks that retry once) are queued
   while no worker runs; then ``celery worker -P prefork -c 2`` starts on
   CPU 0 alone, with PostgreSQL, Redis, the publisher and this process on
   CPU 1. The drain is timed from the first task to the last done (for the
   mirror: until SQL shows every step succeeded). Also against Celery's Redis
   and ``db+postgresql`` result backends. Targets: mirror/plain >= 0.95,
   mirror/Redis >= 1.2, mirror/db+ >= 3.5.
2. **.delay()**: one publisher process on CPU 0 calls ``.delay()`` in a loop;
   the mirror's flusher thread runs beside it as in a web app. Calls per
   second and the publisher's CPU per call. Target: mirror/plain >= 0.9.

CPU per task or call by process is read from ``/proc``. The apps are the
Celery bench's (``bench.throughput.app``, through ``bench.node.app``). The bench
creates and drops its own databases (``pikku_bench_node_mirror``,
``pikku_bench_node_results``) and flushes its own Redis database (8 unless
``--redis-url`` says otherwise, and empty at the start) before each run. The servers get their CPUs
back however the bench ends.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Final

from bench.harness.broker import require_empty
from bench.harness.options import comma_list, parser
from bench.harness.report import say
from bench.harness.session import Session
from bench.node.cpus import SERVER_CPU, require_cpus, servers_on, this_thread_on
from bench.node.report import report_delays, report_delivery, report_drains, report_ratios
from bench.node.runs import DATABASES, MODES, NODE_MIRROR_DATABASE, NodeBench, Settings, measure
from pikku_celery import WorkflowStore

# A database nothing else in the project uses: the acceptance suite takes 9 and 11 to 15
# (12 as a result backend and a broker), the other benches 9, 10 and 13.
DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/8"
SECTIONS: Final = ("drain", "delay")


def settings_from(argv: Sequence[str] | None) -> tuple[Settings, bool]:
    """The run's settings and whether ``--check`` was given."""
    options = parser(
        "node",
        "The mirror against plain Celery on a worker pinned to one CPU: the drain of a full "
        "queue, and .delay() in one publisher process.",
        quick="500 tasks, 1,000 calls, one round",
        databases=DATABASES,
        redis_url=DEFAULT_REDIS_URL,
        rounds=(2, 1, "the best is kept"),
    )
    options.size("--tasks", 3000, 500, "tasks per drain")
    options.size("--calls", 5000, 1000, ".delay() calls per run")
    options.add_argument(
        "--modes",
        type=comma_list(MODES),
        default=MODES,
        help=f"some of {','.join(MODES)} (default all; .delay() runs plain and mirror)",
    )
    options.add_argument(
        "--only",
        type=comma_list(SECTIONS),
        default=SECTIONS,
        help="drain, delay or both (default both)",
    )
    args = options.read(argv)
    settings = Settings(
        tasks=args.tasks,
        calls=args.calls,
        rounds=args.rounds,
        modes=args.modes,
        sections=args.only,
        pg_url=args.pg_url,
        redis_url=args.redis_url,
    )
    return settings, bool(args.check)


def _exit_on_term(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds the finally blocks: the servers get their CPUs back.
    raise SystemExit(128 + signum)


def _load() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    settings, check = settings_from(argv)
    require_cpus()
    require_empty(settings.redis_url)
    signal.signal(signal.SIGTERM, _exit_on_term)
    say(f"load average at the start: {_load()}")
    with Session("node-bench", settings, DATABASES) as session:
        store = WorkflowStore(session.databases.url(NODE_MIRROR_DATABASE))
        store.init()
        store.close()
        with servers_on({SERVER_CPU}), this_thread_on({SERVER_CPU}):
            drains, delays = measure(NodeBench(settings, session))
        report_drains(drains, settings)
        report_delays(delays, settings)
        session.missed += report_ratios(drains, delays)
        report_delivery(drains)
    say()
    say(f"load average at the end: {_load()}")
    return session.finish(check=check)


if __name__ == "__main__":
    sys.exit(main())
