"""The node bench's runs: a full queue drained by a worker on one CPU, and ``.delay()`` loops.

A drain flushes Redis, empties its database, queues the run's tasks with no
worker running (``bench.node.publisher fill``), then starts
``celery worker -P prefork -c 2`` on ``WORKER_CPU`` and times from the run's
first task until the last is done: for plain Celery and Celery's result
backends, the worker's count of finished tasks; for the mirror, the first
poll at which SQL shows every step succeeded. A ``.delay()`` run times one
publisher process (``bench.node.publisher delay``) on ``WORKER_CPU``, away
from the servers. Every run's environment is built afresh, so none carries
another's signal handlers or journal folder.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import sqlalchemy as sa

from bench.harness.broker import redis_client
from bench.harness.cpu import cpu_delta, cpu_snapshot
from bench.harness.delivery import Delivery, load_delivery
from bench.harness.mirror import check_published, clear_mirror, wait_succeeded
from bench.harness.report import say
from bench.harness.session import Common, Runner
from bench.harness.turns import alternated
from bench.harness.workers import BROKER_ENV, run_module_json, running_worker
from bench.node.cpus import WORKER_CPU, this_thread_on, tree_cpus
from bench.node.first import FirstTask
from bench.node.threads import SIDE_THREADS, side_threads_cpu
from bench.throughput.app import (
    ATTEMPTS,
    LOCAL_ENV,
    SCENARIO_ENV,
    STATS_ENV,
    VARIANT_LABELS,
    VARIANTS,
)
from bench.throughput.pools import POOLS
from bench.throughput.publisher import MIN_TASKS_PER_SECOND, SETTLE_TIMEOUT, wait_done

MODES: Final = ("plain", "mirror", "redis", "db")
MODE_LABELS: Final = {
    "plain": "plain Celery",
    "mirror": "mirror, PostgreSQL",
    "redis": "Redis result backend",
    "db": "db+ result backend",
}
#: The Celery bench's scenario (``bench.throughput.app``) each mode runs.
SCENARIO_OF: Final = {
    "plain": "plain",
    "mirror": "pikku",
    "redis": "redisbackend",
    "db": "dbbackend",
}
DELAY_MODES: Final = ("plain", "mirror")
NODE_MIRROR_DATABASE: Final = "pikku_bench_node_mirror"
NODE_RESULTS_DATABASE: Final = "pikku_bench_node_results"
DATABASES: Final = (NODE_MIRROR_DATABASE, NODE_RESULTS_DATABASE)
DATABASE_OF: Final = {"mirror": NODE_MIRROR_DATABASE, "db": NODE_RESULTS_DATABASE}
POOL: Final = POOLS["prefork"]
#: The drain's own work: what the worker and the servers spent, not the bench's waiting.
DRAIN_PARTS: Final = ("worker main", "worker children", "postgres", "redis")


@dataclass(frozen=True)
class Settings(Common):
    tasks: int
    calls: int
    modes: tuple[str, ...]
    sections: tuple[str, ...]


@dataclass(frozen=True)
class DrainRun:
    mode: str
    variant: str
    tasks: int
    #: From the worker's launch to the run's first task.
    startup: float
    #: From the first task to the last done (the mirror: to SQL showing every step).
    drain: float
    #: From the first task to the worker counting its last.
    worker_drain: float
    #: The publisher's filling of the queue: ``publish``, ``written``, ``cpu`` seconds.
    fill: Mapping[str, float]
    #: CPU seconds by part over the drain.
    cpu: Mapping[str, float]
    delivery: Delivery | None = None
    check: str | None = None

    @property
    def rate(self) -> float:
        return self.tasks / self.drain

    @property
    def rate_from_start(self) -> float:
        return self.tasks / (self.startup + self.drain)

    def ms(self, part: str) -> float:
        return self.cpu.get(part, 0.0) * 1000 / self.tasks

    @property
    def cpu_ms(self) -> float:
        return sum(self.ms(part) for part in DRAIN_PARTS)

    @property
    def fill_ms(self) -> float:
        return self.fill["cpu"] * 1000 / self.tasks


@dataclass(frozen=True)
class DelayRun:
    mode: str
    calls: int
    #: The ``.delay()`` loop alone.
    loop: float
    loop_cpu: float
    #: The part of ``loop_cpu`` spent by threads but the calling one (the mirror's flusher).
    loop_threads: float
    #: From the loop's start until the mirror had written every call (plain: the loop).
    written: float
    #: CPU seconds by part from the loop's start until written.
    cpu: Mapping[str, float]
    check: str | None = None

    @property
    def rate(self) -> float:
        return self.calls / self.loop

    def us(self, part: str) -> float:
        return self.cpu.get(part, 0.0) * 1e6 / self.calls

    @property
    def loop_us(self) -> float:
        return self.loop_cpu * 1e6 / self.calls

    @property
    def loop_threads_us(self) -> float:
        return self.loop_threads * 1e6 / self.calls


@contextmanager
def pinned_worker(
    env: Mapping[str, str], name: str, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``celery worker -P prefork -c 2`` of ``bench.node.app`` on ``WORKER_CPU`` alone.

    The worker inherits the CPU of the thread that starts it; this thread is on
    ``WORKER_CPU`` only while it does (and waits for the worker's answer to a
    ping), and back on its own CPU for the rest.
    """
    with ExitStack() as stack:
        with this_thread_on({WORKER_CPU}):
            worker = stack.enter_context(
                running_worker("bench.node.app", name, POOL, env, env[BROKER_ENV], log)
            )
        yield worker


class NodeBench(Runner[Settings]):
    """The drains and ``.delay()`` loops of one bench."""

    def env(self, mode: str, database_url: str | None, stats_dir: Path) -> dict[str, str]:
        # A journal folder per run: a run's worker must not find another run's journals.
        local = self.tmp / f"local-{self.count}"
        scenario = {SCENARIO_ENV: SCENARIO_OF[mode], STATS_ENV: str(stats_dir)}
        return self.worker_env({**scenario, LOCAL_ENV: str(local)}, database_url, local)

    def database_url(self, mode: str) -> str | None:
        name = DATABASE_OF.get(mode)
        if name is None:
            return None
        url = self.databases.url(name)
        if mode == "mirror":
            clear_mirror(url)
        return url

    def _check_pinned(self, run: str, worker_pid: int) -> None:
        stray = {pid: cpus for pid, cpus in tree_cpus(worker_pid).items() if cpus != {WORKER_CPU}}
        if stray:
            self.problems.append(f"{run}: worker processes not on CPU {WORKER_CPU} only: {stray}")

    def _settled(self, url: str, run: str, tasks: int) -> float:
        engine = sa.create_engine(url, pool_size=1)
        try:
            return wait_succeeded(engine, tasks, SETTLE_TIMEOUT, run)
        finally:
            engine.dispose()

    def drain(self, mode: str, variant: str, progress: str) -> DrainRun:
        self.next_run()
        url = self.database_url(mode)
        stats_dir = self.tmp / f"stats-{self.count}"
        env = self.env(mode, url, stats_dir)
        run = f"node:{mode}:{variant}:{self.count}"
        tasks = self.settings.tasks
        fill = run_module_json(
            "bench.node.publisher",
            ["fill", "--variant", variant, "--tasks", str(tasks), "--run", run],
            env,
        )
        client = redis_client(self.settings.redis_url)
        timeout = 60 + tasks * ATTEMPTS[variant] / MIN_TASKS_PER_SECOND
        log = self.tmp / f"worker-{self.count}-{mode}-{variant}.log"
        first = FirstTask(client, run, DATABASES)
        first.start()
        launched = time.time()
        try:
            with pinned_worker(env, f"node-{mode}", log) as worker:
                self._check_pinned(run, worker.pid)
                start = first.wait(timeout)
                worker_done = wait_done(client, run, tasks, timeout)
                finished = worker_done
                if mode == "mirror" and url is not None:
                    finished = max(worker_done, self._settled(url, run, tasks))
                after = cpu_snapshot(worker.pid, DATABASES)
                after[SIDE_THREADS] = side_threads_cpu(worker.pid)
        finally:
            first.stop()
        check = None
        if mode == "mirror" and url is not None:
            check = self.check_mirror(url, run, tasks, ATTEMPTS[variant])
        self.check_log(run, log)
        result = DrainRun(
            mode,
            variant,
            tasks,
            startup=start.time - launched,
            drain=finished - start.time,
            worker_drain=worker_done - start.time,
            fill=fill,
            cpu=cpu_delta(start.cpu, after),
            delivery=load_delivery(stats_dir) if mode == "mirror" else None,
            check=check,
        )
        line = (
            f"[{progress}] drain  {MODE_LABELS[mode]:<21} {VARIANT_LABELS[variant]:<10} "
            f"{result.rate:7.1f} tasks/s ({result.rate_from_start:.1f} from the worker's start, "
            f"start-up {result.startup:.2f} s), {result.cpu_ms:.2f} CPU ms/task"
        )
        say(line + (f"  mirror: {check}" if check else ""))
        return result

    def delay(self, mode: str, progress: str) -> DelayRun:
        self.next_run()
        url = self.database_url(mode)
        env = self.env(mode, url, self.tmp / f"stats-{self.count}")
        run = f"node:delay:{mode}:{self.count}"
        calls = self.settings.calls
        args = ["delay", "--calls", str(calls), "--run", run]
        for name in DATABASES:
            args += ["--database", name]
        with this_thread_on({WORKER_CPU}):
            report = run_module_json("bench.node.publisher", args, env)
        check = None
        if mode == "mirror" and url is not None:
            ok, check = check_published(url, run, calls)
            if not ok:
                self.problems.append(f"{run}: {check}")
        result = DelayRun(
            mode,
            calls,
            loop=report["loop"],
            loop_cpu=report["loop_cpu"],
            loop_threads=report["loop_threads"],
            written=report["written"],
            cpu=report["cpu"],
            check=check,
        )
        line = (
            f"[{progress}] delay  {MODE_LABELS[mode]:<21} {result.rate:9.0f} calls/s, "
            f"{result.loop_us:.1f} µs CPU per call in the loop, "
            f"{result.us('this process'):.1f} until written"
        )
        say(line + (f"  mirror: {check}" if check else ""))
        return result


def measure(bench: NodeBench) -> tuple[list[DrainRun], list[DelayRun]]:
    """Every run, round by round; the order of the modes is reversed every other round."""
    settings = bench.settings
    drains: list[tuple[str, str]] = []
    if "drain" in settings.sections:
        drains = [(mode, variant) for variant in VARIANTS for mode in settings.modes]
    delays: list[str] = []
    if "delay" in settings.sections:
        delays = [mode for mode in DELAY_MODES if mode in settings.modes]
    drain_runs: list[DrainRun] = []
    delay_runs: list[DelayRun] = []
    total = (len(drains) + len(delays)) * settings.rounds
    for round_no in range(settings.rounds):
        for mode, variant in alternated(drains, round_no):
            done = len(drain_runs) + len(delay_runs) + 1
            drain_runs.append(bench.drain(mode, variant, f"{done}/{total} round {round_no + 1}"))
        for mode in alternated(delays, round_no):
            done = len(drain_runs) + len(delay_runs) + 1
            delay_runs.append(bench.delay(mode, f"{done}/{total} round {round_no + 1}"))
    return drain_runs, delay_runs
