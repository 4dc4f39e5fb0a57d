"""The measured ceiling of one PostgreSQL: its CPU, commits, WAL and bytes per task.

Run from the project root, as root (it makes a PostgreSQL server of its own)::

    python -m bench.ceiling            # 1,500 tasks and 50 chords a workload, 3 rounds
    python -m bench.ceiling --quick    # 300 tasks and 10 chords, one round; under 2 minutes

For each workload a real ``celery worker -P prefork -c 2`` on Redis, the mirror on
the bench's own PostgreSQL: (a) lone no-op tasks, Celery's result backend off;
(b) a task that fails its first attempt and retries once; (c) lone no-op tasks
with ``backend="pikku://"``, ``task_track_started``, ``result_extended`` and the
caller ``get()``-ing each; (d) chords of 20 header tasks and a body on
``pikku://``. It reports the CPU of every process of the server per task and
the ceiling it implies (tasks a second per PostgreSQL core, 1000 / CPU ms),
the commits and WAL bytes per task, and the bytes of rows and indexes each
task leaves. Method and figures: ``bench/README.md``, "Ceiling benchmark".
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from types import FrameType
from typing import Final

from bench.ceiling.app import BY_KEY, WORKLOADS
from bench.ceiling.cluster import OwnCluster
from bench.ceiling.report import report
from bench.ceiling.runs import CeilingBench, Run, Settings, database_of
from bench.harness.broker import require_empty
from bench.harness.options import comma_list, parser
from bench.harness.report import say
from bench.harness.session import Session
from bench.harness.turns import alternated

# A Redis database no other bench or suite of the project uses (they take 8 to 15).
DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/7"
DEFAULT_PORT: Final = 5499


def settings_from(argv: Sequence[str] | None) -> tuple[Settings, int]:
    """The run's settings and the port of the bench's own server."""
    options = parser(
        "ceiling",
        "PostgreSQL's CPU, commits, WAL and bytes kept per task, and the ceiling they imply, "
        "for lone tasks, retries, results and chords, on a PostgreSQL server of the bench's own.",
        quick="300 tasks and 10 chords a workload, one round",
        redis_url=DEFAULT_REDIS_URL,
        rounds=(3, 1, "the median is reported, with the range"),
    )
    options.size("--tasks", 1500, 300, "lone tasks a run of (a), (b) and (c)")
    options.size("--chords", 50, 10, "chords of 20 a run of (d)")
    keys = tuple(BY_KEY)
    options.add_argument(
        "--workloads",
        type=comma_list(keys),
        default=keys,
        help=f"some of {','.join(keys)} (default all)",
    )
    options.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the port of the server the bench makes and drops (default {DEFAULT_PORT})",
    )
    args = options.read(argv)
    settings = Settings(
        pg_url="",
        redis_url=args.redis_url,
        rounds=args.rounds,
        tasks=args.tasks,
        chords=args.chords,
        workloads=tuple(BY_KEY[key] for key in args.workloads),
    )
    return settings, int(args.port)


def _exit_on_term(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds the with blocks: the bench's server is dropped.
    raise SystemExit(128 + signum)


def _load() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def measure(bench: CeilingBench) -> list[Run]:
    """Every workload in every round; their order reversed every other round."""
    settings = bench.settings
    runs: list[Run] = []
    total = len(settings.workloads) * settings.rounds
    for round_no in range(settings.rounds):
        for workload in alternated(settings.workloads, round_no):
            runs.append(bench.run(workload, f"{len(runs) + 1}/{total} round {round_no + 1}"))
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    settings, port = settings_from(argv)
    require_empty(settings.redis_url)
    signal.signal(signal.SIGTERM, _exit_on_term)
    say(f"load average at the start: {_load()} ({os.cpu_count()} CPUs)")
    with OwnCluster(port) as cluster:
        say(f"PostgreSQL {cluster.version}, the bench's own, on port {port}")
        settings = replace(settings, pg_url=cluster.url)
        databases = [database_of(workload) for workload in WORKLOADS]
        with Session("ceiling-bench", settings, databases, create=False) as session:
            runs = measure(CeilingBench(settings, session))
            report(runs)
    say()
    say(f"load average at the end: {_load()}")
    return session.finish(check=False)


if __name__ == "__main__":
    sys.exit(main())
