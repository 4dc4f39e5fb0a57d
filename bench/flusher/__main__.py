"""CPU of the flusher per lone no-op task, with no worker around it.

A journal holds what a worker node's flusher writes for lone no-op tasks (each task's
start, with the adoption its worker records the step from, and its success; with
``--publish``, its publish too); the recorder writes it in batches of ``--batch-tasks``
tasks to a scratch PostgreSQL database (or SQLite with ``--sqlite``). The figure is the
flushing thread's CPU time (``time.thread_time``) per task, median of the rounds: what
the flusher costs the worker's CPU, free of the machine's other load.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness.postgres import DEFAULT_PG_URL, BenchDatabases
from bench.store.lone_tasks import TASK_INPUT, WORKER, new_ids, published_steps
from pikku_celery.mirror import Recorder
from pikku_celery.store import WorkflowStore

DATABASE = "pikku_bench_flusher"


def journal_tasks(mirror: Recorder, count: int, *, publish: bool) -> None:
    """A lone no-op task's events, as its worker (and publisher) journal them."""
    pid = os.getpid()
    steps = published_steps("bench.noop", count) if publish else None
    for index, step_id in enumerate(new_ids(count)):
        if steps is not None:
            step_id = steps[index].step_id
            mirror.published(steps[index])
        adoption = mirror.adoption(
            step_id,
            "bench.noop",
            "bench.noop",
            published=False,
            data=TASK_INPUT,
            routing={"exchange": "", "routing_key": "celery"},
            sent_at=time.time(),
        )
        mirror.started(step_id, 1, worker=WORKER, pid=pid, adoption=adoption)
        mirror.succeeded(step_id, step_id, 1, None)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.flusher", description=__doc__)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--sqlite", action="store_true", help="a SQLite file instead")
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per round")
    parser.add_argument("--batch-tasks", type=int, default=25, help="tasks per batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--publish", action="store_true", help="journal the publish too")
    parser.add_argument("--profile", type=Path, help="write cProfile stats of the flushes here")
    parser.add_argument("--quick", action="store_true", help="500 tasks, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.rounds = 500, 3
    per_task = 3 if args.publish else 2
    databases = None
    with tempfile.TemporaryDirectory(prefix="pikku-flusher-") as scratch:
        if args.sqlite:
            url = f"sqlite:///{scratch}/bench.db"
        else:
            databases = BenchDatabases(args.pg_url, [DATABASE])
            url = databases.fresh(DATABASE)
        store = WorkflowStore(url)
        store.init()
        mirror = Recorder(
            store,
            journal_dir=Path(scratch) / "journal",
            batch_size=args.batch_tasks * per_task,
            background=False,
        )
        profile = cProfile.Profile(time.thread_time) if args.profile else None
        try:
            journal_tasks(mirror, args.batch_tasks * 4, publish=args.publish)  # warm-up
            mirror.flush()
            figures = []
            for round_no in range(args.rounds):
                journal_tasks(mirror, args.tasks, publish=args.publish)
                if profile is not None:
                    profile.enable()
                cpu, wall = time.thread_time(), time.perf_counter()
                if not mirror.flush():
                    raise SystemExit("the database is away")
                cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                if profile is not None:
                    profile.disable()
                if mirror.journal_depth:
                    raise SystemExit(f"{mirror.journal_depth} events left in the journal")
                figures.append(cpu / args.tasks * 1e6)
                print(
                    f"round {round_no + 1}: {figures[-1]:.1f} µs CPU a task, "
                    f"{wall / args.tasks * 1e6:.1f} µs wall"
                )
            batch = statistics.median(figures) * args.batch_tasks / 1000
            print(
                f"median {statistics.median(figures):.1f} µs CPU a task "
                f"({batch:.2f} ms a batch of {args.batch_tasks} tasks)"
            )
            if profile is not None:
                profile.dump_stats(args.profile)
                pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(40)
        finally:
            mirror.close()
            store.close()
            if databases is not None:
                databases.drop()


if __name__ == "__main__":
    main()
