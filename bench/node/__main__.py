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

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Final

from bench.harness.broker import flush, redis_client
from bench.harness.postgres import DEFAULT_PG_URL, PG_URL_ENV, BenchDatabases
from bench.harness.report import say
from bench.node.cpus import SERVER_CPU, require_cpus, servers_on, this_thread_on
from bench.node.report import report_delays, report_delivery, report_drains, report_ratios
from bench.node.runs import DATABASES, MODES, NODE_MIRROR_DATABASE, NodeBench, Settings, measure
from pikku_celery import WorkflowStore

# A database nothing else in the project uses: the acceptance suite takes 9 and 11 to 15
# (12 as a result backend and a broker), the other benches 9, 10 and 13.
DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/8"
SECTIONS: Final = ("drain", "delay")


def _names(choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An option's comma-separated list of ``choices``."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
        if not names or any(name not in choices for name in names):
            raise argparse.ArgumentTypeError(f"some of {','.join(choices)}")
        return names

    return parse


def require_unused(redis_url: str) -> None:
    """Refuse a Redis database that holds anything: the bench flushes it before every run,
    and on a shared server it may be someone else's."""
    keys = redis_client(redis_url).dbsize()
    if keys:
        raise SystemExit(
            f"{redis_url} holds {keys} keys; the bench flushes its database, so it wants an "
            "empty one: pass another --redis-url (or flush it, if it is the bench's own)"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.node",
        description="The mirror against plain Celery on a worker pinned to one CPU: the drain "
        "of a full queue, and .delay() in one publisher process.",
    )
    parser.add_argument("--tasks", type=int, help="tasks per drain (default 3000, --quick 500)")
    parser.add_argument(
        "--calls", type=int, help=".delay() calls per run (default 5000, --quick 1000)"
    )
    parser.add_argument(
        "--rounds", type=int, help="rounds; the best is kept (default 2, --quick 1)"
    )
    parser.add_argument(
        "--modes",
        type=_names(MODES),
        default=MODES,
        help=f"some of {','.join(MODES)} (default all; .delay() runs plain and mirror)",
    )
    parser.add_argument(
        "--only",
        type=_names(SECTIONS),
        default=SECTIONS,
        help="drain, delay or both (default both)",
    )
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG_URL,
        help=f"an existing PostgreSQL database to connect to (default ${PG_URL_ENV}, "
        f"else {DEFAULT_PG_URL}); the bench creates and drops "
        f"{' and '.join(repr(name) for name in DATABASES)} on its server",
    )
    parser.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS_URL,
        help=f"the broker and Redis result backend (default {DEFAULT_REDIS_URL}); "
        "this database is flushed",
    )
    parser.add_argument("--quick", action="store_true", help="500 tasks, 1,000 calls, one round")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed, too")
    return parser.parse_args(argv)


def _exit_on_term(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds the finally blocks: the servers get their CPUs back.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings(
        tasks=args.tasks or (500 if args.quick else 3000),
        calls=args.calls or (1000 if args.quick else 5000),
        rounds=args.rounds or (1 if args.quick else 2),
        modes=args.modes,
        sections=args.only,
        pg_url=args.pg_url,
        redis_url=args.redis_url,
    )
    if min(settings.tasks, settings.calls, settings.rounds) < 1:
        raise SystemExit("--tasks, --calls and --rounds must be at least 1")
    require_cpus()
    require_unused(settings.redis_url)
    signal.signal(signal.SIGTERM, _exit_on_term)
    started = time.perf_counter()
    say(f"load average at the start: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    databases = BenchDatabases(settings.pg_url, DATABASES)
    databases.create()
    tmp = Path(tempfile.mkdtemp(prefix="node-bench-"))
    bench = NodeBench(settings, databases, tmp)
    missed: list[str] = []
    try:
        store = WorkflowStore(databases.url(NODE_MIRROR_DATABASE))
        store.init()
        store.close()
        with servers_on({SERVER_CPU}), this_thread_on({SERVER_CPU}):
            drains, delays = measure(bench)
        report_drains(drains, settings)
        report_delays(delays, settings)
        missed = report_ratios(drains, delays)
        report_delivery(drains)
    finally:
        flush(settings.redis_url)
        databases.drop()
        shutil.rmtree(tmp, ignore_errors=True)
    say()
    say(f"load average at the end: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    for target in missed:
        say(f"TARGET MISSED: {target}")
    for problem in bench.problems:
        say(f"MIRROR PROBLEM: {problem}")
    say(f"done in {time.perf_counter() - started:.0f} s")
    return 1 if bench.problems or (args.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
