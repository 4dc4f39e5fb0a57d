"""The node bench's publisher, in a process of its own and the scenario's environment.

``python -m bench.node.publisher fill ...`` puts a run's tasks on the queue
while no worker runs, and waits until its mirror (if any) has written their
publishes, so the drain that follows has only the worker's work to do.

``python -m bench.node.publisher delay ...`` times ``.delay()`` calls: a
warm-up (the broker connection, the mirror's journal and flusher thread), then
``--calls`` calls in a row. The mirror's flusher runs beside them as in any
publishing process (a web app): its batches are part of the price. It reports
the loop's time and CPU, and the CPU until the mirror has written every call.

Both print one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

from bench.harness.cpu import cpu_delta, cpu_snapshot
from bench.harness.delivery import delivery_snapshot, wait_written
from bench.node.threads import SIDE_THREADS, side_threads_cpu
from bench.throughput.app import (
    BY_KEY,
    SCENARIO_ENV,
    VARIANTS,
    bench_app,
    task_name,
    warm_key,
)

# The mirror writes 3,000 publishes in a few seconds; a minute means it is stuck.
WRITTEN_TIMEOUT: Final = 60.0


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _snapshot(databases: Sequence[str]) -> dict[str, float]:
    snapshot = cpu_snapshot(None, databases)
    snapshot[SIDE_THREADS] = side_threads_cpu(os.getpid())
    return snapshot


def _task(variant: str) -> Any:
    if bench_app is None:
        raise SystemExit(f"the publisher needs ${SCENARIO_ENV}")
    return bench_app.app.tasks[task_name(BY_KEY[os.environ[SCENARIO_ENV]].key, variant)]


def _written() -> None:
    """Until the mirror has written every publish: one left behind would be written by the
    worker's node flusher, and charged to the drain."""
    assert bench_app is not None
    wait_written(bench_app.pikku, WRITTEN_TIMEOUT)
    snapshot = delivery_snapshot(bench_app.pikku) if bench_app.pikku is not None else None
    if snapshot is not None and snapshot["written"] < snapshot["appended"]:
        raise SystemExit(
            f"the publisher's mirror wrote {snapshot['written']} of {snapshot['appended']} "
            f"events within {WRITTEN_TIMEOUT:.0f} s"
        )


def fill(args: argparse.Namespace) -> dict[str, Any]:
    task = _task(args.variant)
    cpu = _own_cpu()
    clock = time.perf_counter()
    for _ in range(args.tasks):
        task.apply_async((args.run, args.tasks))
    published = time.perf_counter() - clock
    _written()
    return {
        "publish": published,
        "written": time.perf_counter() - clock,
        "cpu": _own_cpu() - cpu,
    }


def delay(args: argparse.Namespace) -> dict[str, Any]:
    task = _task("noop")
    warm = warm_key(args.run)
    for _ in range(args.warmup):
        task.delay(warm, args.warmup)
    _written()
    before = _snapshot(args.database)
    clock = time.perf_counter()
    for _ in range(args.calls):
        task.delay(args.run, args.calls)
    loop = time.perf_counter() - clock
    loop_cpu = _own_cpu() - before["this process"]
    loop_threads = side_threads_cpu(os.getpid()) - before[SIDE_THREADS]
    _written()
    written = time.perf_counter() - clock
    after = _snapshot(args.database)
    return {
        "loop": loop,
        "written": written,
        "loop_cpu": loop_cpu,
        "loop_threads": loop_threads,
        "cpu": cpu_delta(before, after),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node.publisher")
    commands = parser.add_subparsers(dest="command", required=True)
    filling = commands.add_parser("fill", help="queue a drain's tasks")
    filling.add_argument("--variant", choices=VARIANTS, default="noop")
    filling.add_argument("--tasks", type=int, required=True)
    filling.add_argument("--run", required=True)
    delaying = commands.add_parser("delay", help="time .delay() calls")
    delaying.add_argument("--calls", type=int, required=True)
    delaying.add_argument("--warmup", type=int, default=200)
    delaying.add_argument("--run", required=True)
    delaying.add_argument(
        "--database", action="append", default=[], help="a bench database, for its CPU"
    )
    args = parser.parse_args(argv)
    report = fill(args) if args.command == "fill" else delay(args)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
