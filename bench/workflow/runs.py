"""Starting, finishing and quiescing the workflow bench's runs, and what they add up to.

A kind's runs go out in batches (``--concurrent`` in flight at once); a batch
ends once the worker has run every task its runs needed and its mirror has
committed what they wrote, so no SQL of one batch is counted in the next.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from celery import chain

from bench.harness.broker import redis_client
from bench.harness.cpu import cpu_snapshot
from bench.harness.turns import rotated
from bench.workflow.app import CHAIN_NAME, BenchApp
from bench.workflow.sql_counts import Counts, SqlCounter, worker_counts

# The bench's own database on the PostgreSQL server: the mirror's, and whose backends'
# CPU counts as the bench's.
DATABASE: Final = "pikku_bench_workflow"
KINDS: Final = ("workflow", "chain", "celery")


@dataclass(frozen=True)
class RunResult:
    kind: str
    run_id: str
    steps: int
    started: dt.datetime
    ended: dt.datetime
    output: Any

    @property
    def ms_per_step(self) -> float:
        return (self.ended - self.started).total_seconds() * 1000 / self.steps


@dataclass
class Tally:
    """What some runs of one kind added up to: their times, SQL, tasks and CPU."""

    kind: str
    runs: list[RunResult] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    cpu: dict[str, float] = field(default_factory=dict)
    tasks_expected: int = 0

    def add(self, other: Tally) -> None:
        self.runs.extend(other.runs)
        self.counts.add(other.counts)
        for name, seconds in other.cpu.items():
            self.cpu[name] = self.cpu.get(name, 0.0) + seconds
        self.tasks_expected += other.tasks_expected


class Bench:
    """Starts the runs of each kind on the worker and waits for them, counting their SQL."""

    def __init__(
        self,
        bench: BenchApp,
        probe: SqlCounter,
        count_dir: Path,
        steps: int,
        redis_url: str,
        worker_pid: int,
    ) -> None:
        self.bench = bench
        self.probe = probe
        self.count_dir = count_dir
        self.steps = steps
        self.redis = redis_client(redis_url)
        self.worker_pid = worker_pid
        self.timeout = 30.0 + 2.0 * steps

    def counts(self) -> Counts:
        total = worker_counts(self.count_dir)
        total.add(self.probe.counts)
        return total

    def tasks_per_run(self, kind: str) -> int:
        # A workflow: every step, plus a replay at the start and after each step.
        return 2 * self.steps + 1 if kind == "workflow" else self.steps

    def start(self, kind: str) -> tuple[str, dt.datetime]:
        bench = self.bench
        started = dt.datetime.now(dt.timezone.utc)
        with self.probe.on_behalf("publish"):
            if kind == "workflow":
                run_id = bench.seq.start(self.steps)
            elif kind == "chain":
                links = (bench.inc.s() for _ in range(self.steps - 1))
                run_id = bench.pikku.run(chain(bench.inc.s(0), *links), name=CHAIN_NAME)
            else:
                run_id = f"wfbench:{uuid.uuid4()}"  # the Redis key the last link reports to
                links = (bench.plain_inc.s() for _ in range(self.steps - 2))
                chain(bench.plain_inc.s(0), *links, bench.plain_last.s(run_id)).apply_async()
        return run_id, started

    def finish(self, kind: str, run_id: str, started: dt.datetime) -> RunResult:
        if kind == "celery":
            deadline = time.monotonic() + self.timeout
            answer: Any = None
            while answer is None and time.monotonic() < deadline:
                answer = self.redis.blpop([run_id], timeout=1)
            if answer is None:
                raise SystemExit(f"the plain chain {run_id} did not finish in {self.timeout} s")
            at, output = json.loads(answer[1])
            ended = dt.datetime.fromtimestamp(at, dt.timezone.utc)
            return RunResult(kind, run_id, self.steps, started, ended, output)
        with self.probe.on_behalf("poll"):
            # pikku.wait only reads the run, so it serves a chain's run as well.
            output = self.bench.pikku.wait(run_id, timeout=self.timeout)
            run = self.bench.pikku.store.get_run(run_id)
        return RunResult(kind, run_id, self.steps, started, run.updated_at, output)

    def quiesce(self, before: Counts, expected: int) -> Counts:
        """The counts once the worker has run (and counted) every task the runs needed,
        and its mirror has committed what those tasks wrote: the totals stop changing."""
        deadline = time.monotonic() + self.timeout
        while True:
            delta = self.counts().minus(before)
            if sum(delta.tasks.values()) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        # A batch's last commit comes a flush interval after its last task (40 ms).
        while time.monotonic() < deadline:
            time.sleep(0.15)
            settled = self.counts().minus(before)
            if settled.as_json() == delta.as_json():
                return settled
            delta = settled
        return delta

    def batch(self, kind: str, count: int) -> Tally:
        """``count`` runs of ``kind`` in flight together, until the worker is idle again.

        Extra tasks (a duplicate replay) would be counted in the next batch and
        show up as a kind's task count differing from the expected one.
        """
        before, cpu_before = self.counts(), cpu_snapshot(self.worker_pid, (DATABASE,))
        ours = os.times()
        started = [self.start(kind) for _ in range(count)]
        runs = [self.finish(kind, run_id, at) for run_id, at in started]
        expected = count * self.tasks_per_run(kind)
        counts = self.quiesce(before, expected)
        ours_after = os.times()
        cpu_after = cpu_snapshot(self.worker_pid, (DATABASE,))
        cpu = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
        # Our own CPU without the /proc scans around it.
        cpu["this process"] = (ours_after.user + ours_after.system) - (ours.user + ours.system)
        return Tally(kind, runs, counts, cpu, expected)

    def rounds(self, kinds: Sequence[str], runs: int, concurrent: int) -> dict[str, Tally]:
        """``runs`` runs of each kind, ``concurrent`` at a time, the kinds taking turns.

        A slow spell of the shared machine then falls on every kind alike.
        """
        tallies = {kind: Tally(kind) for kind in kinds}
        for turn in range(-(-runs // concurrent)):
            in_flight = min(concurrent, runs - turn * concurrent)
            for kind in rotated(kinds, turn):
                tallies[kind].add(self.batch(kind, in_flight))
        return tallies
