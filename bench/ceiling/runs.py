"""One workload's measured run: a fresh database, a worker, a warm-up, then the interval.

Each run makes its workload's database afresh and its schema, starts
``celery worker -P prefork -c 2`` of ``bench.ceiling.app`` on Redis, and sends a
warm-up (the worker's and the caller's connections, the schema's first pages)
until SQL shows it done. The interval is read from there: the server's
counters, then the caller process sending the workload (and ``get()``-ing
its results where it has them), then SQL polled until it shows every step
succeeded, then the counters again.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Final

from bench.ceiling.app import WORKLOAD_ENV, Workload
from bench.ceiling.figures import Figures, figures
from bench.ceiling.server import Reader
from bench.harness.report import say
from bench.harness.session import Common, Runner
from bench.harness.workers import run_module_json, running_worker
from bench.throughput.pools import POOLS
from pikku_celery import WorkflowStore

__all__ = ["CeilingBench", "Run", "Settings", "database_of"]

POOL: Final = POOLS["prefork"]
# Each look at SQL costs the server a little: often enough to end the interval near the
# last step, rarely enough that the reading connection's own CPU stays small (it is taken
# off anyway).
POLL: Final = 0.1
# Slow enough to mean the worker is stuck rather than slow.
MIN_TASKS_PER_SECOND: Final = 5
WARMUP_UNITS: Final = 2


def database_of(workload: Workload) -> str:
    return f"pikku_bench_ceiling_{workload.key}"


@dataclass(frozen=True)
class Settings(Common):
    tasks: int
    chords: int
    workloads: tuple[Workload, ...]

    def units(self, workload: Workload) -> int:
        """Lone tasks, or chords, the caller sends in the interval."""
        return self.chords if workload.tasks_per_unit > 1 else self.tasks


@dataclass(frozen=True)
class Run:
    workload: Workload
    figures: Figures
    #: The machine's load averages (1, 5, 15 minutes) before and after the interval.
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


class CeilingBench(Runner[Settings]):
    """The runs of one bench."""

    def run(self, workload: Workload, progress: str) -> Run:
        count = self.next_run()
        name = database_of(workload)
        url = self.databases.fresh(name)
        store = WorkflowStore(url)
        store.init()
        store.close()
        local = self.tmp / f"local-{count}"
        env = self.worker_env({WORKLOAD_ENV: workload.key}, url, local)
        log = self.tmp / f"worker-{count}-{workload.key}.log"
        units = self.settings.units(workload)
        tasks = units * workload.tasks_per_unit
        warm = WARMUP_UNITS * workload.tasks_per_unit
        worker = running_worker(
            "bench.ceiling.app", f"ceiling-{workload.key}", POOL, env, self.settings.redis_url, log
        )
        with worker:
            reader = Reader(url)
            try:
                self._send(workload, WARMUP_UNITS, f"warm-{count}", env)
                self._wait(reader, warm, warm)
                load_before = os.getloadavg()
                before = reader.read()
                clock = time.perf_counter()
                self._send(workload, units, f"run-{count}", env)
                self._wait(reader, warm + tasks, tasks)
                seconds = time.perf_counter() - clock
                after = reader.read()
                load_after = os.getloadavg()
            finally:
                reader.close()
        self.check_log(f"run {count} ({workload.key})", log)
        # A chord's steps are checked by the caller, which gets every body's value.
        if workload.tasks_per_unit == 1:
            self.check_mirror(url, f"run-{count}", units, workload.attempts)
        measured = figures(before, after, tasks, seconds)
        say(
            f"[{progress}] {workload.label:<34} {tasks:>6,} tasks in {seconds:5.1f} s: "
            f"{measured.cpu_ms:.3f} PostgreSQL CPU ms a task, {measured.commits:.3f} commits, "
            f"{measured.wal_bytes:,.0f} WAL bytes, {measured.notifies:.3f} NOTIFYs, "
            f"{measured.kept_bytes:,.0f} bytes kept"
        )
        return Run(workload, measured, load_before, load_after)

    def _send(self, workload: Workload, units: int, run: str, env: dict[str, str]) -> None:
        run_module_json("bench.ceiling.client", ["--count", str(units), "--run", run], env)

    def _wait(self, reader: Reader, total: int, tasks: int) -> None:
        deadline = time.monotonic() + 60 + tasks / MIN_TASKS_PER_SECOND
        while (done := reader.succeeded()) < total:
            if time.monotonic() > deadline:
                raise SystemExit(f"SQL shows {done}/{total} steps succeeded; see the worker's log")
            time.sleep(POLL)
