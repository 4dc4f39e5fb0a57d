"""The mirror's one-flusher-per-node design against plain Celery, on a worker with one CPU.

Run from the project root, as root (it pins the PostgreSQL and Redis servers)::

    python -m bench.node            # 3,000 tasks, 5,000 calls, best of 2
    python -m bench.node --quick    # 500 tasks, 1,000 calls, one round

The drain of a full queue by ``celery worker -P prefork -c 2`` on CPU 0 alone (the servers,
the publisher and this process on CPU 1), against plain Celery and Celery's Redis and
``db+`` result backends, and ``.delay()`` in one publisher process. Method, targets and
figures: ``bench/README.md``, "Node benchmark". The servers get their CPUs back however
the bench ends.
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
        check="exit 1 when a target is missed, too",
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
