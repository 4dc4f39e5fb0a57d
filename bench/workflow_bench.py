"""A durable workflow against the same steps as a Celery chain, on one real worker.

Run from the project root::

    python -m bench.workflow_bench            # 20 steps, 20 runs of each kind; 65-100 s here
    python -m bench.workflow_bench --quick    # 5 runs of each kind, no pg_stat cross-check

Every kind runs a no-op step, ``inc(x) -> x + 1``, ``--steps`` times in a
row, on one ``celery worker --pool=prefork -c 2`` with Redis as the broker
and the mirror on PostgreSQL:

* ``workflow``: ``@pikku.workflow("seq")`` doing ``x = ctx.do("inc", inc, x)``
  in a loop, started with ``seq.start(steps)``;
* ``chain``: ``chain(inc.s(0), inc.s(), ...)`` of the same ``@pikku.step``
  task, published with ``pikku.run(chain, name="chain")``;
* ``celery``: the same chain of a plain ``@app.task``, which pikku does not
  mirror. It is not part of the target: it shows what Celery alone costs.

By default one run is in flight at a time (``--concurrent 1``): a run is
started, waited for, then the next one starts, so the figure is the latency
of a step, not the worker's throughput. The kinds take turns run by run, in
a rotating order, so a slow spell of the shared machine falls on every kind
alike. A run lasts from the moment the bench calls ``start``/``run`` until
the time the worker stamped on the write that completed the run
(``workflow_runs.updated_at``; same host, same clock), so the backoff of the
bench's polling does not inflate it. Two runs of each kind warm up first.

SQL statements are counted with a SQLAlchemy ``before_cursor_execute``
listener in every process that talks to the bench database: the bench
process (publishing: ``seq.start``, ``pikku.run``) and each pool child of
the worker (the mirror's signal handlers, the orchestrator, the step's
duplicate check). Each statement is labelled with the ``WorkflowStore``
method that sent it, and the time spent in it is summed (so is the time of
each commit). ``BEGIN`` and ``COMMIT``, which psycopg sends on its own, are
not statements here; transactions are counted separately (each autocommit
statement, each commit). The bench's own polling for the end of a run is
counted apart and left out of the per-step figures. CPU time comes from
``/proc`` for the worker's processes and the bench database's backends.

As a cross-check, ``pg_stat_database`` gives the transactions the server saw
for the bench database: over the whole timed phase, then over three more
untimed runs of each kind. Each read waits until idle backends have flushed
their statistics, which PostgreSQL 15 does within 10 s (``--stats-wait``).

This module is also the worker's app: ``celery -A bench.workflow_app
worker`` builds it from ``WFBENCH_*`` environment variables at import. The
bench creates and drops its own database (``pikku_bench_workflow``) and
flushes its Redis database first.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from celery import chain

from bench.harness.broker import DEFAULT_REDIS_URL, REDIS_URL_ENV, flush, redis_client
from bench.harness.cpu import cpu_snapshot
from bench.harness.postgres import DEFAULT_PG_URL, PG_URL_ENV, BenchDatabases
from bench.harness.report import say
from bench.harness.timing import p90
from bench.harness.workers import clean_env, mirror_failures, running_worker
from bench.sql_counts import Counts, SqlCounter, worker_counts
from bench.workflow_app import (
    BROKER_ENV,
    CHAIN_NAME,
    COUNT_DIR_ENV,
    DATABASE_ENV,
    BenchApp,
    build_app,
)
from pikku_celery.store import StepAttempt

DATABASE: Final = "pikku_bench_workflow"

KINDS: Final = ("workflow", "chain", "celery")
CONCURRENCY: Final = 2
WARMUP_RUNS: Final = 2
# Runs of each kind for the per-kind pg_stat_database cross-check (not timed).
CHECK_RUNS: Final = 3
# Who sent SQL to the bench database: the worker's children, and this process
# publishing and polling ("other" is this process's other SQL, e.g. the admin
# connection to another database).
SECTIONS: Final = ("worker", "publish", "poll")
TARGET: Final = 2.0
# PostgreSQL 15 flushes an idle backend's statistics within 10 s.
STATS_WAIT: Final = 11.0
# The CPU table's rows: the worker, the bench database's server side, this process.
CPU_PARTS: Final = ("worker children", "worker main", "postgres", "this process")


# --- running the kinds ------------------------------------------------------------------


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


@dataclass(frozen=True)
class ServerCheck:
    """Transactions ``pg_stat_database`` saw over some runs, and what the processes counted."""

    runs: int
    server: int
    pikku: int
    polling: int


@dataclass
class KindSummary:
    tally: Tally
    steps: int
    server: ServerCheck | None = None

    @property
    def kind(self) -> str:
        return self.tally.kind

    @property
    def runs(self) -> list[RunResult]:
        return self.tally.runs

    @property
    def counts(self) -> Counts:
        return self.tally.counts

    @property
    def cpu(self) -> dict[str, float]:
        return self.tally.cpu

    @property
    def step_count(self) -> int:
        return len(self.runs) * self.steps

    @property
    def median(self) -> float:
        return statistics.median(run.ms_per_step for run in self.runs)

    @property
    def p90(self) -> float:
        return p90([run.ms_per_step for run in self.runs])

    @property
    def statements(self) -> int:
        return self.counts.statements_in("worker", "publish")

    @property
    def transactions(self) -> int:
        return pikku_transactions(self.counts)

    @property
    def tasks(self) -> int:
        return sum(self.counts.tasks.values())

    def per_step(self, value: float) -> float:
        return value / self.step_count

    @property
    def server_per_step(self) -> float | None:
        """pg_stat_database's transactions per step, less the bench's polling."""
        if self.server is None:
            return None
        return (self.server.server - self.server.polling) / (self.server.runs * self.steps)


def pikku_transactions(counts: Counts) -> int:
    return counts.transactions["worker"] + counts.transactions["publish"]


def ms(delta: dt.timedelta) -> float:
    return delta.total_seconds() * 1000


@dataclass
class Timeline:
    """Mean milliseconds of each part of a step, from the attempts' own timestamps."""

    parts: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.parts.setdefault(name, []).append(value)

    def mean(self, name: str) -> float:
        values = self.parts.get(name, [])
        return statistics.fmean(values) if values else float("nan")


TIMELINE_PARTS: Final = (
    "step to step",
    "orchestrate",
    "orchestrate, first quarter",
    "orchestrate, last quarter",
    "deliver",
    "run",
    "start to first step scheduled",
    "last step to run completed",
)


def timeline(store: Any, summary: KindSummary) -> Timeline:
    """Where a step's time goes, from steps 2..n (step 1 also carries the start).

    * ``step to step``: one step's success to the next one's;
    * workflow: ``orchestrate`` (a step's success to the next step's claim by
      the replay: the orchestrate message and the replay), ``deliver`` (claim
      to running: the step message and the running write) and ``run``
      (running to succeeded: the duplicate check, the task, the success write);
    * chain: ``deliver`` (the previous link's publish to running) and ``run``
      (which includes publishing the next link).
    """
    result = Timeline()
    quarter = max(1, summary.steps // 4)
    for run in summary.runs:
        attempts: list[StepAttempt] = sorted(
            store.get_run_history(run.run_id), key=lambda attempt: attempt.created_at
        )
        if not attempts:
            continue
        if attempts[0].scheduled_at is not None:
            result.add("start to first step scheduled", ms(attempts[0].scheduled_at - run.started))
        if attempts[-1].succeeded_at is not None:
            result.add("last step to run completed", ms(run.ended - attempts[-1].succeeded_at))
        for index in range(1, len(attempts)):
            previous, attempt = attempts[index - 1], attempts[index]
            done, scheduled = previous.succeeded_at, attempt.scheduled_at
            running, succeeded = attempt.running_at, attempt.succeeded_at
            if done is None or scheduled is None or running is None or succeeded is None:
                continue
            result.add("step to step", ms(succeeded - done))
            result.add("deliver", ms(running - scheduled))
            result.add("run", ms(succeeded - running))
            if summary.kind == "workflow":
                hop = ms(scheduled - done)
                result.add("orchestrate", hop)
                if index < quarter:
                    result.add("orchestrate, first quarter", hop)
                if index >= len(attempts) - quarter:
                    result.add("orchestrate, last quarter", hop)
    return result


def _cell(value: float | None, width: int, digits: int = 2) -> str:
    if value is None or value != value:  # missing, or NaN
        return f"{'-':>{width}}"
    return f"{value:{width}.{digits}f}"


def report(
    summaries: dict[str, KindSummary], timelines: dict[str, Timeline], concurrent: int
) -> bool:
    workflow, chain_ = summaries["workflow"], summaries["chain"]
    floor = summaries.get("celery")
    shown = [workflow, chain_] + ([floor] if floor else [])
    say()
    say(
        f"{workflow.steps} steps per run, {len(workflow.runs)} runs of each kind, "
        f"{concurrent} run(s) in flight at a time"
    )
    say()
    header = (
        f"{'kind':<9} {'steps':>5} {'runs':>4} {'ms/step med':>11} {'ms/step p90':>11} "
        f"{'stmts/step':>10} {'xacts/step':>10} {'pg xacts/step':>13} {'tasks/step':>10}"
    )
    say(header)
    say("-" * len(header))

    def row(summary: KindSummary) -> None:
        server = summary.server_per_step
        say(
            f"{summary.kind:<9} {summary.steps:>5} {len(summary.runs):>4} "
            f"{_cell(summary.median, 11)} {_cell(summary.p90, 11)} "
            f"{_cell(summary.per_step(summary.statements), 10)} "
            f"{_cell(summary.per_step(summary.transactions), 10)} {_cell(server, 13)} "
            f"{_cell(summary.per_step(summary.tasks), 10)}"
        )

    row(workflow)
    row(chain_)
    wall = workflow.median / chain_.median
    wall_p90 = workflow.p90 / chain_.p90
    stmts = workflow.per_step(workflow.statements) / chain_.per_step(chain_.statements)
    xacts = workflow.per_step(workflow.transactions) / chain_.per_step(chain_.transactions)
    say(f"{'ratio':<9} {'':>5} {'':>4} {wall:11.2f} {wall_p90:11.2f} {stmts:10.2f} {xacts:10.2f}")
    if floor is not None:
        say("-" * len(header))
        row(floor)
        say(
            "(celery: the same chain of plain Celery tasks, not mirrored, on the same "
            "worker: what Celery alone costs)"
        )
    say()
    wall_ok, stmts_ok = wall <= TARGET, stmts <= TARGET
    say(
        f"Target, workflow/chain <= {TARGET:g} per step: wall time (median) {wall:.2f} "
        f"{'met' if wall_ok else 'NOT met'}; SQL statements {stmts:.2f} "
        f"{'met' if stmts_ok else 'NOT met'}."
    )
    say(
        "(xacts: transactions counted by the processes; pg xacts: pg_stat_database's "
        "count for the bench database over separate untimed runs, less the bench's polling)"
    )

    say()
    say("Statements per step, by side and the WorkflowStore method that sent them:")
    pikku_sides = ("worker", "publish")
    labels = sorted(
        {
            key
            for summary in (workflow, chain_)
            for key in summary.counts.statements
            if key.split(":", 1)[0] in pikku_sides
        }
    )
    say(f"  {'side:method':<40} {'workflow':>9} {'chain':>9}")
    for label in labels:
        cells = [_cell(s.per_step(s.counts.statements[label]), 9) for s in (workflow, chain_)]
        say(f"  {label:<40} {cells[0]} {cells[1]}")

    say()
    say("SQL wait per step, ms, by side and what sent it (statements, then commits):")
    timed = sorted(
        {
            key
            for summary in (workflow, chain_)
            for key in summary.counts.sql_ms
            if key.split(":", 1)[0] in pikku_sides
        },
        key=lambda key: ("COMMIT" in key, key),
    )
    say(f"  {'side:method':<40} {'workflow':>9} {'chain':>9}")
    for label in timed:
        cells = [_cell(s.per_step(s.counts.sql_ms.get(label, 0.0)), 9) for s in (workflow, chain_)]
        say(f"  {label:<40} {cells[0]} {cells[1]}")

    say()
    say("Per step, ms: waiting on SQL (execute + commit) and CPU by process:")
    names = [s.kind for s in shown]
    say(f"  {'':<40} " + " ".join(f"{name:>9}" for name in names))
    for side in pikku_sides:
        cells = [_cell(s.per_step(s.counts.sql_ms_in(side)), 9) for s in shown]
        say(f"  {'SQL wait, ' + side:<40} " + " ".join(cells))
    for part in CPU_PARTS:
        cells = [_cell(s.per_step(s.cpu[part] * 1000) if part in s.cpu else None, 9) for s in shown]
        say(f"  {'CPU, ' + part:<40} " + " ".join(cells))

    say()
    say("Tasks run by the worker:")
    for summary in shown:
        tasks = ", ".join(f"{name} {n}" for name, n in sorted(summary.counts.tasks.items()))
        say(f"  {summary.kind:<9} {summary.tally.tasks_expected} expected; {tasks}")

    say()
    say("Mean ms per step from the attempts' timestamps (steps 2..n):")
    say(f"  {'part':<40} {'workflow':>9} {'chain':>9}")
    for name in TIMELINE_PARTS:
        cells = [_cell(timelines[kind].mean(name), 9) for kind in ("workflow", "chain")]
        say(f"  {name:<40} {cells[0]} {cells[1]}")
    return wall_ok and stmts_ok


def check_runs(summaries: dict[str, KindSummary], store: Any) -> list[str]:
    problems: list[str] = []
    for summary in summaries.values():
        for run in summary.runs:
            if run.output != summary.steps:
                problems.append(f"{summary.kind} run {run.run_id} returned {run.output!r}")
            if summary.kind == "celery":
                continue
            states = store.list_step_states(run.run_id)
            done = sum(state.status == "succeeded" for state in states)
            if len(states) != summary.steps or done != summary.steps:
                problems.append(
                    f"{summary.kind} run {run.run_id}: {done}/{len(states)} steps succeeded"
                )
        if summary.tasks != summary.tally.tasks_expected:
            problems.append(
                f"{summary.kind}: {summary.tasks} tasks ran, "
                f"{summary.tally.tasks_expected} expected"
            )
    floor = summaries.get("celery")
    if floor is not None and floor.statements:
        problems.append("the plain Celery chain sent SQL: it should not be mirrored")
    return problems


# --- the driver -----------------------------------------------------------------------


def worker_env(database_url: str, redis_url: str, count_dir: Path) -> dict[str, str]:
    return clean_env(
        {BROKER_ENV: redis_url, DATABASE_ENV: database_url, COUNT_DIR_ENV: str(count_dir)}
    )


def rotated(kinds: Sequence[str], turn: int) -> list[str]:
    """The kinds in a different order each round, so none always follows the same one."""
    shift = turn % len(kinds)
    return [*kinds[shift:], *kinds[:shift]]


def measure(
    args: argparse.Namespace, database: BenchDatabases, work: Path
) -> tuple[bool, list[str]]:
    count_dir = work / "counts"
    count_dir.mkdir()
    log = work / "worker.log"
    probe = SqlCounter("other")
    probe.install()
    database_url = database.url(DATABASE)
    bench_app = build_app(args.redis_url, database_url)
    store = bench_app.pikku.store
    store.init()
    kinds = [kind for kind in KINDS if kind != "celery" or not args.no_floor]
    tallies = {kind: Tally(kind) for kind in kinds}
    checks: dict[str, ServerCheck] = {}
    total_check: tuple[int, int] | None = None
    try:
        env = worker_env(database_url, args.redis_url, count_dir)
        pool = ("--pool=prefork", "-c", str(CONCURRENCY))
        with running_worker(
            "bench.workflow_app", "wfbench", pool, env, args.redis_url, log
        ) as worker:
            bench = Bench(bench_app, probe, count_dir, args.steps, args.redis_url, worker.pid)
            say(f"worker ready; warming up with {WARMUP_RUNS} runs of each kind")
            for kind in kinds:
                bench.batch(kind, WARMUP_RUNS)
            check = args.stats_wait > 0
            baseline = database.transactions(DATABASE, wait=args.stats_wait) if check else 0
            before = bench.counts()
            # One run (or --concurrent runs) of each kind in turn: a slow spell of the
            # shared machine falls on every kind alike.
            clock = time.monotonic()
            rounds = -(-args.runs // args.concurrent)
            for turn in range(rounds):
                in_flight = min(args.concurrent, args.runs - turn * args.concurrent)
                for kind in rotated(kinds, turn):
                    tallies[kind].add(bench.batch(kind, in_flight))
            say(f"{args.runs} runs of each kind in {time.monotonic() - clock:.1f} s")
            if check:
                # The whole timed phase: what the server saw against what we counted.
                server = database.transactions(DATABASE, wait=args.stats_wait)
                # Not "other": that is the admin connection, to another database.
                delta = bench.counts().minus(before).transactions
                total_check = (server - baseline, sum(delta[s] for s in SECTIONS))
                baseline = server
                # Per kind: a few more runs each, with the server's count settled between.
                for kind in ("workflow", "chain"):
                    extra = bench.batch(kind, 1)
                    for _ in range(CHECK_RUNS - 1):
                        extra.add(bench.batch(kind, 1))
                    server = database.transactions(DATABASE, wait=args.stats_wait)
                    checks[kind] = ServerCheck(
                        runs=CHECK_RUNS,
                        server=server - baseline,
                        pikku=pikku_transactions(extra.counts),
                        polling=extra.counts.transactions["poll"],
                    )
                    baseline = server
        summaries = {
            kind: KindSummary(tallies[kind], args.steps, checks.get(kind)) for kind in kinds
        }
        with probe.on_behalf("other"):
            timelines = {kind: timeline(store, summaries[kind]) for kind in ("workflow", "chain")}
            problems = check_runs(summaries, store)
        ok = report(summaries, timelines, args.concurrent)
        if total_check is not None:
            say()
            say("Cross-check, transactions the server saw for the bench database:")
            server, counted = total_check
            say(
                f"  timed phase, all kinds: pg_stat_database {server}, counted by the "
                f"processes {counted} (pikku and the bench's polling)"
            )
            for kind, result in checks.items():
                say(
                    f"  {result.runs} more {kind} runs: pg_stat_database {result.server}, "
                    f"counted {result.pikku + result.polling} "
                    f"({result.pikku} pikku + {result.polling} polling)"
                )
            say(
                "  (a few more on the server than counted: psycopg prepares a statement on "
                "its 6th use on a connection,\n   a Parse + Sync round trip that is a "
                "transaction of its own and that no SQLAlchemy event sees)"
            )
        failures = mirror_failures(log, "Traceback")
        if failures:
            problems.append(f"the worker logged {len(failures)} failures, first: {failures[0]}")
        return ok, problems
    finally:
        store.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.workflow_bench",
        description="Per-step wall time and SQL of a durable workflow vs a Celery chain.",
    )
    parser.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    parser.add_argument(
        "--runs", type=int, help="measured runs of each kind (default 20; 5 with --quick)"
    )
    parser.add_argument(
        "--concurrent", type=int, default=1, help="runs in flight at once (default 1)"
    )
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG_URL,
        help=f"PostgreSQL admin URL (default ${PG_URL_ENV} or the local server); the bench "
        f"creates and drops {DATABASE} on that server",
    )
    parser.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS_URL,
        help=f"broker (default ${REDIS_URL_ENV} or the local server); this database is flushed",
    )
    parser.add_argument(
        "--stats-wait",
        type=float,
        help=f"seconds to let PostgreSQL flush statistics before each pg_stat_database "
        f"read (default {STATS_WAIT:g}; 0, the default with --quick, skips the cross-check)",
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the plain Celery chain (the floor)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="5 runs of each kind, no pg_stat cross-check"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = 5 if args.quick else 20
    if args.stats_wait is None:
        args.stats_wait = 0.0 if args.quick else STATS_WAIT
    if args.steps < 2 or args.runs < 1 or args.concurrent < 1:
        parser.error("--steps must be 2 or more, --runs and --concurrent 1 or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    database = BenchDatabases(args.pg_url, (DATABASE,))
    flush(args.redis_url)
    database.create()
    work = Path(tempfile.mkdtemp(prefix="pikku-wfbench-"))
    try:
        ok, problems = measure(args, database, work)
    finally:
        database.drop()
    say()
    if problems:
        say(f"PROBLEMS ({len(problems)}); worker log kept in {work / 'worker.log'}:")
        for problem in problems[:20]:
            say(f"  {problem}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        say("Every run returned its step count, every step succeeded once, no mirror failures.")
    return 1 if (args.check and not ok) or problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
