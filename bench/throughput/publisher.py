"""The publisher of the Celery benchmark: one timed run, in a process of its own.

``python -m bench.throughput.publisher`` is started by the driver for every run,
in the scenario's environment: it warms up, publishes the run's tasks, waits
until the worker (and, for a mirrored run, SQL) shows them done, and prints
one JSON line with the times and the CPU spent by every process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

import redis
import sqlalchemy as sa

from bench.harness.broker import redis_client
from bench.harness.cpu import cpu_delta, cpu_snapshot
from bench.harness.delivery import wait_written
from bench.harness.mirror import wait_succeeded
from bench.harness.workers import DATABASE_ENV
from bench.throughput.app import (
    ATTEMPTS,
    BY_KEY,
    MIRROR_DATABASE,
    RESULTS_DATABASE,
    SCENARIO_ENV,
    VARIANTS,
    WARMUP_TASKS,
    bench_app,
    done_key,
    task_name,
    warm_key,
)

# Slow enough to mean the worker is stuck rather than slow.
MIN_TASKS_PER_SECOND: Final = 5
SETTLE_TIMEOUT: Final = 60.0
DATABASES: Final = (MIRROR_DATABASE, RESULTS_DATABASE)


def wait_done(client: redis.Redis, run: str, total: int, timeout: float) -> float:
    """The worker's time of finishing the run's last task."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Short blocking calls: the client's socket timeout is shorter than a slow run.
        answer: Any = client.blpop([done_key(run)], timeout=1)
        if answer is not None:
            return float(answer[1])
    count = client.get(run)
    raise SystemExit(
        f"{run}: {int(count or 0)}/{total} tasks done after {timeout:.0f} s; see the worker's log"
    )


def publish(args: argparse.Namespace) -> int:
    """One timed run: warm up, publish ``--tasks`` tasks, wait until they are done."""
    if bench_app is None:
        raise SystemExit(f"the publisher needs ${SCENARIO_ENV}")
    scenario = BY_KEY[os.environ[SCENARIO_ENV]]
    task = bench_app.app.tasks[task_name(scenario.key, args.variant)]
    client = redis_client(bench_app.app.conf.broker_url)
    timeout = 60 + args.tasks * ATTEMPTS[args.variant] / MIN_TASKS_PER_SECOND
    mirror_db = None
    if scenario.mirror:
        mirror_db = sa.create_engine(os.environ[DATABASE_ENV], pool_size=1)
    try:
        warm = warm_key(args.run)
        for _ in range(WARMUP_TASKS):
            task.apply_async((warm, WARMUP_TASKS))
        wait_done(client, warm, WARMUP_TASKS, timeout)
        if mirror_db is not None:
            wait_succeeded(mirror_db, WARMUP_TASKS, SETTLE_TIMEOUT, warm)

        if bench_app.recorder is not None:
            bench_app.recorder.mark()
        before = cpu_snapshot(args.worker_pid, DATABASES)
        started = time.time()
        clock = time.perf_counter()
        for _ in range(args.tasks):
            task.apply_async((args.run, args.tasks))
        published = time.perf_counter() - clock
        worker_done = wait_done(client, args.run, args.tasks, timeout)
        finished = worker_done
        if mirror_db is not None:
            settled = wait_succeeded(mirror_db, args.tasks, SETTLE_TIMEOUT, args.run)
            finished = max(worker_done, settled)
        after = cpu_snapshot(args.worker_pid, DATABASES)
    finally:
        if mirror_db is not None:
            mirror_db.dispose()
    wait_written(bench_app.pikku)
    if bench_app.recorder is not None:
        bench_app.recorder.dump("publisher")
    report = {
        "elapsed": finished - started,
        "worker_elapsed": worker_done - started,
        "publish": published,
        "cpu": cpu_delta(before, after),
        "forced_events": bench_app.forced_events,
    }
    print(json.dumps(report), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput.publisher")
    parser.add_argument("--variant", choices=VARIANTS, default="noop")
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--worker-pid", type=int, required=True)
    return publish(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
