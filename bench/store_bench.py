"""The mirror's SQL write path against the raw-driver floor, on PostgreSQL and SQLite.

Run from the project root::

    python -m bench.store_bench                    # both sections, a few minutes
    python -m bench.store_bench --quick            # small numbers, under a minute
    python -m bench.store_bench --section batch    # only the group commits

``batch``: the mirror's group commits. A batch is B lone tasks (see
``bench.lone_tasks``). Three paths take turns: ``apply_batch`` with the
batches prebuilt; the mirror end to end (every signal's event journaled, then
``flush()``: decoding, planning, ``apply_batch``, journal clean-up); and the
floor, the DBAPI calls of one ``apply_batch`` replayed per batch in one
transaction with fresh ids and times prepared before the clock starts. A task
counts as three transitions: publish, running, succeeded.

``index``: one transition as the mirror writes it at low load (a batch of
one) and one ``get_step_state``, with about a thousand attempt rows in
``workflow_step_history`` and again with about a million, and the query plans
of the statements involved.

The bench creates and drops its own databases (``pikku_bench`` and
``pikku_bench_big`` on the PostgreSQL server, fresh files for SQLite).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final, Protocol

from bench.bulk_load import Bulk, count_rows
from bench.harness.postgres import DEFAULT_PG_URL, PG_URL_ENV, BenchDatabases
from bench.harness.profiling import say_profile
from bench.harness.report import fmt, say, table, verdict
from bench.harness.sqlite import SqliteFiles
from bench.harness.timing import timed
from bench.lone_tasks import (
    TASK_TRANSITIONS,
    apply_batches,
    lone_task_batch,
    mirror_tasks,
    new_ids,
    published_steps,
    transition,
)
from bench.store_floor import CapturedBatch, Floor, capture_calls
from pikku_celery.integration.mirror import CeleryMirror
from pikku_celery.store import MirrorBatch, RunOutcome, WorkflowStore

TARGET_RATIO: Final = 0.7
# Above this, the 1M timing is no longer "the same" as the 1k one: a B-tree
# lookup gains a level or two over that range, a scan gains a thousandfold.
FLAT_LIMIT: Final = 1.5
SECTIONS: Final = ("batch", "index")
# Each side's runs carry their own workflow name, so each side's rows can be counted.
BATCH_SIDES: Final = ("apply_batch", "mirror", "floor")
WARMUP_STEPS: Final = 20
# Small blocks: the index probes need many turns to even out bursts of the machine.
PROBE_BLOCK_STEPS: Final = 10
MAIN: Final = "pikku_bench"
BIG: Final = "pikku_bench_big"


@dataclass(frozen=True)
class Settings:
    rounds: int
    small_rows: int
    big_rows: int
    probe_steps: int
    profile: bool
    batch_size: int
    batch_tasks: int


class Databases(Protocol):
    def fresh(self, name: str) -> str: ...

    def drop(self) -> None: ...


@dataclass(frozen=True)
class Target:
    """One database kind: where its bench databases are made, and how it explains a plan."""

    name: str
    databases: Databases
    explain_prefix: str
    plan_column: int

    @contextmanager
    def opened(self, which: str) -> Iterator[WorkflowStore]:
        store = WorkflowStore(self.databases.fresh(which))
        try:
            store.init()
            yield store
        finally:
            store.close()


# --- group commits ------------------------------------------------------------


def side_workflow(side: str) -> str:
    return f"bench.{side}"


def completed_runs(store: WorkflowStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT workflow, count(*) FROM workflow_runs WHERE status = 'completed' "
            "GROUP BY workflow"
        ).all()
    return {str(workflow): int(count) for workflow, count in rows}


@dataclass(frozen=True)
class BatchThroughput:
    database: str
    batch_size: int
    statements: int
    rates: dict[str, list[float]]  # tasks per second, per side and round

    def tasks(self, side: str) -> float:
        return statistics.median(self.rates[side])

    def ratio(self, side: str) -> float:
        return self.tasks(side) / self.tasks("floor")

    def overhead_us(self, side: str) -> float:
        return (1 / self.tasks(side) - 1 / self.tasks("floor")) * 1e6

    @property
    def met(self) -> bool:
        return self.ratio("apply_batch") >= TARGET_RATIO


def capture_batch(store: WorkflowStore, size: int) -> CapturedBatch:
    made = dt.datetime.now(dt.timezone.utc)
    batch = lone_task_batch(store, side_workflow("floor"), new_ids(size))
    return CapturedBatch(capture_calls(store, partial(apply_batches, store, [batch])), made)


def measure_batches(target: Target, settings: Settings) -> BatchThroughput:
    size = settings.batch_size
    batches = max(1, settings.batch_tasks // size)
    tasks = batches * size
    with (
        target.opened(MAIN) as store,
        tempfile.TemporaryDirectory(prefix="pikku-journal-") as journal,
    ):
        mirror = CeleryMirror(
            store, journal_dir=journal, batch_size=size * TASK_TRANSITIONS, background=False
        )
        floor = Floor(store)
        try:
            plan = capture_batch(store, size)
            steps = published_steps(side_workflow("mirror"), size)
            sent = [call.sql for call in capture_calls(store, partial(mirror_tasks, mirror, steps))]
            if sent != [call.sql for call in plan.calls]:
                say("  note: the mirror's flush sends other statements than apply_batch here")
            # Warm-up: a batch per side outside the rounds.
            apply_batches(store, [lone_task_batch(store, "bench.warm", new_ids(size))])
            floor.apply(plan.fresh())
            mirror_tasks(mirror, published_steps("bench.warm", size))
            rates: dict[str, list[float]] = {side: [] for side in BATCH_SIDES}
            for round_no in range(settings.rounds):
                # Made before the clock starts: the store's batches as the planner
                # hands them over, the floor's calls with fresh values, the mirror's
                # steps as the publisher's signal handler has them.
                store_batches = [
                    lone_task_batch(store, side_workflow("apply_batch"), new_ids(size))
                    for _ in range(batches)
                ]
                floor_batches = [plan.fresh() for _ in range(batches)]
                mirror_batches = [
                    published_steps(side_workflow("mirror"), size) for _ in range(batches)
                ]
                before = completed_runs(store)
                spent = dict.fromkeys(BATCH_SIDES, 0.0)
                for block in range(batches):
                    actions: list[tuple[str, Callable[[], object]]] = [
                        ("apply_batch", partial(apply_batches, store, store_batches[block:][:1])),
                        ("mirror", partial(mirror_tasks, mirror, mirror_batches[block])),
                        ("floor", partial(floor.apply, floor_batches[block])),
                    ]
                    # Each side takes each place in turn, so a slow spell of the
                    # disk or a checkpoint lands on every side alike.
                    turn = (round_no + block) % len(actions)
                    for side, action in actions[turn:] + actions[:turn]:
                        spent[side] += timed(action)
                after = completed_runs(store)
                for side in BATCH_SIDES:
                    done = after.get(side_workflow(side), 0) - before.get(side_workflow(side), 0)
                    if done != tasks:
                        raise RuntimeError(f"{side} completed {done} of {tasks} runs")
                    rates[side].append(tasks / spent[side])
                say(
                    f"  round {round_no + 1}/{settings.rounds}: "
                    + ", ".join(f"{side} {rates[side][-1]:,.0f} tasks/s" for side in BATCH_SIDES)
                )
        finally:
            floor.close()
            mirror.close()
    return BatchThroughput(target.name, size, len(plan.calls), rates)


def profile_batches(target: Target, settings: Settings) -> None:
    """Where apply_batch's time goes: cProfile over prebuilt batches."""
    size = settings.batch_size
    batches = max(1, settings.batch_tasks // size)
    with target.opened(MAIN) as store:
        apply_batches(store, [lone_task_batch(store, "bench.warm", new_ids(size))])
        work = [lone_task_batch(store, "bench.profiled", new_ids(size)) for _ in range(batches)]
        profiler = cProfile.Profile()
        profiler.runcall(apply_batches, store, work)
    say_profile(profiler, batches * size, "task", f"{batches} batches of {size} tasks")


# --- index check --------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    history_rows: int
    step_rows: int
    transition_us: float
    get_step_state_us: float


@dataclass(frozen=True)
class IndexCheck:
    database: str
    small: Sample
    big: Sample
    plans: list[tuple[str, list[str]]]

    @property
    def transition_ratio(self) -> float:
        return self.big.transition_us / self.small.transition_us

    @property
    def get_ratio(self) -> float:
        return self.big.get_step_state_us / self.small.get_step_state_us

    @property
    def flat(self) -> bool:
        return self.transition_ratio <= FLAT_LIMIT and self.get_ratio <= FLAT_LIMIT

    @property
    def indexed(self) -> bool:
        return all(uses_index(self.database, lines) for _, lines in self.plans)


# A plan line reading one of the mirror's tables whole.
_PG_SCAN: Final = re.compile(r"Seq Scan on workflow_")
_SQLITE_SCAN: Final = re.compile(r"^SCAN workflow_\w+(?! USING)")


def uses_index(database: str, plan: list[str]) -> bool:
    scan = _PG_SCAN if database == "postgresql" else _SQLITE_SCAN
    return not any(scan.search(line) for line in plan)


def one_transition(store: WorkflowStore, step_id: str, status: str) -> None:
    """A batch of one transition, as the mirror commits it when it has nothing else to send."""
    now = dt.datetime.now(dt.timezone.utc)
    batch = MirrorBatch(transitions=[transition(store, step_id, status, now, now)])
    if status == "succeeded":
        batch.outcomes.append(RunOutcome(step_id, step_id, "complete", now))
    apply_batches(store, [batch])


class IndexProbe:
    """Timed transitions and reads against one database, in blocks so two can take turns."""

    def __init__(self, store: WorkflowStore, steps: int, label: str) -> None:
        self.store = store
        warm = self._publish(WARMUP_STEPS, f"{label}-warm")
        self.transition_times: list[float] = []
        self.get_times: list[float] = []
        self.transitions(warm, 0, len(warm))
        self.gets(warm, 0, len(warm))
        self.step_ids = self._publish(steps, label)
        self.transition_times.clear()
        self.get_times.clear()

    def _publish(self, count: int, label: str) -> list[str]:
        step_ids = new_ids(count)
        apply_batches(self.store, [lone_task_batch(self.store, label, step_ids, finished=False)])
        return step_ids

    def transitions(self, step_ids: Sequence[str], lo: int, hi: int) -> None:
        for step_id in step_ids[lo:hi]:
            for status in ("running", "succeeded"):
                self.transition_times.append(
                    timed(partial(one_transition, self.store, step_id, status))
                )

    def gets(self, step_ids: Sequence[str], lo: int, hi: int) -> None:
        for step_id in step_ids[lo:hi]:
            # As many reads as transitions, so both medians rest on as many calls.
            for _ in range(2):
                self.get_times.append(timed(partial(self.store.get_step_state, step_id, "task")))

    def sample(self) -> Sample:
        history_rows, step_rows = count_rows(self.store.engine)
        return Sample(
            history_rows=history_rows,
            step_rows=step_rows,
            transition_us=statistics.median(self.transition_times) * 1e6,
            get_step_state_us=statistics.median(self.get_times) * 1e6,
        )


def interleaved(probes: Sequence[IndexProbe], steps: int) -> None:
    """Both databases measured in alternating blocks, in the same minutes.

    Timed one after the other, a slow spell of the machine would pass for a
    difference between the sizes.
    """
    for method in (IndexProbe.transitions, IndexProbe.gets):
        for block, lo in enumerate(range(0, steps, PROBE_BLOCK_STEPS)):
            for probe in probes if block % 2 == 0 else probes[::-1]:
                method(probe, probe.step_ids, lo, lo + PROBE_BLOCK_STEPS)


_EXPLAINABLE: Final = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")


def query_plans(target: Target, store: WorkflowStore) -> list[tuple[str, list[str]]]:
    """The plans of ``get_step_state`` and of a transition's statements, on ``store``."""
    [step_id] = new_ids(1)
    apply_batches(store, [lone_task_batch(store, "explain", [step_id], finished=False)])
    labelled = [
        ("get_step_state", call)
        for call in capture_calls(store, partial(store.get_step_state, step_id, "task"))
    ] + [
        ("transition", call)
        for call in capture_calls(store, partial(one_transition, store, step_id, "running"))
    ]
    floor = Floor(store)
    try:
        plans: list[tuple[str, list[str]]] = []
        for label, call in labelled:
            if call.sql.lstrip().upper().startswith(_EXPLAINABLE):
                rows = floor.explain(target.explain_prefix, call)
                plans.append(
                    (f"{label}: {_head(call.sql)}", [str(row[target.plan_column]) for row in rows])
                )
    finally:
        floor.close()
    return plans


def _head(sql: str) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= 60 else text[:57] + "..."


def measure_index(target: Target, settings: Settings) -> IndexCheck:
    probe = settings.probe_steps
    with target.opened(MAIN) as small_store, target.opened(BIG) as big_store:
        # The probes add their own steps' attempt rows; the bulk load makes up the rest.
        own_rows = probe + WARMUP_STEPS
        Bulk(small_store.engine).load(max(4, settings.small_rows - own_rows))
        started = time.perf_counter()
        Bulk(big_store.engine).load(settings.big_rows - own_rows)
        loaded = time.perf_counter() - started
        say(f"  bulk-loaded {settings.big_rows:,} attempt rows in {loaded:.1f} s")
        probes = [IndexProbe(small_store, probe, "small"), IndexProbe(big_store, probe, "big")]
        interleaved(probes, probe)
        small, big = (one.sample() for one in probes)
        for one in (small, big):
            say(
                f"  {one.history_rows:,} attempt rows: transition {one.transition_us:,.1f} µs, "
                f"get_step_state {one.get_step_state_us:,.1f} µs"
            )
        plans = query_plans(target, big_store)
    return IndexCheck(database=target.name, small=small, big=big, plans=plans)


# --- report -------------------------------------------------------------------


def report_batches(rows: Sequence[BatchThroughput]) -> None:
    say()
    say(
        "Group commits: lone tasks per second (median of rounds; one transaction per "
        f"batch; {TASK_TRANSITIONS} transitions per task: publish, running, succeeded)"
    )
    lines: list[list[str]] = []
    for row in rows:
        floor = row.tasks("floor")
        for side in ("apply_batch", "mirror"):
            gated = side == "apply_batch"
            lines.append(
                [
                    row.database,
                    side if gated else "mirror+journal",
                    str(row.batch_size),
                    str(row.statements),
                    f"{row.tasks(side):,.0f}",
                    f"{floor:,.0f}",
                    f"{row.ratio(side):.3f}",
                    verdict(row.ratio(side), TARGET_RATIO) if gated else "-",
                    f"{row.overhead_us(side):.1f}",
                ]
            )
    header = [
        "database", "path", "batch", "calls/batch", "tasks/s", "floor tasks/s",
        "path/floor", f">= {TARGET_RATIO}", "µs/task extra",
    ]  # fmt: skip
    table(header, lines)


def report_index(checks: Sequence[IndexCheck]) -> None:
    say()
    say("Index check (median µs per call; a transition is a batch of one)")
    rows: list[list[str]] = []
    for check in checks:
        for sample in (check.small, check.big):
            rows.append(
                [
                    check.database,
                    f"{sample.history_rows:,}",
                    f"{sample.step_rows:,}",
                    fmt(sample.transition_us, ".1f"),
                    fmt(sample.get_step_state_us, ".1f"),
                ]
            )
        rows.append(
            [check.database, "ratio", "", fmt(check.transition_ratio), fmt(check.get_ratio)]
        )
    table(["database", "attempt rows", "step rows", "transition", "get_step_state"], rows)
    for check in checks:
        say()
        indexed = "every plan uses an index" if check.indexed else "A PLAN SCANS A TABLE"
        flat = "flat" if check.flat else f"NOT flat (limit {FLAT_LIMIT})"
        say(f"{check.database}, {check.big.history_rows:,} attempt rows: {indexed}; cost {flat}")
        for label, lines in check.plans:
            say(f"  {label}")
            for line in lines:
                say(f"    {line}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.store_bench",
        description="The mirror's group commits against the raw-driver floor, and the cost "
        "of a transition and of get_step_state at 1k vs 1M attempt rows.",
    )
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG_URL,
        help=f"a PostgreSQL server to bench on (default: ${PG_URL_ENV} or the local server); "
        f"the bench creates and drops its own databases {MAIN} and {BIG} there",
    )
    parser.add_argument(
        "--sqlite-path",
        type=Path,
        help="a new file for the SQLite database (default: one in a temporary directory); "
        "it and a -big sibling are deleted afterwards",
    )
    parser.add_argument(
        "--section",
        choices=("all", *SECTIONS),
        default="all",
        help="batch: group commits (apply_batch and the mirror); index: 1k vs 1M attempt rows",
    )
    parser.add_argument("--batch-size", type=int, help="lone tasks per group commit (default 100)")
    parser.add_argument("--tasks", type=int, help="lone tasks per side per round (batch)")
    parser.add_argument("--rounds", type=int, help="throughput rounds; the median is reported")
    parser.add_argument("--big-rows", type=int, help="attempt rows for the large index sample")
    parser.add_argument("--quick", action="store_true", help="small numbers, under a minute")
    parser.add_argument("--only", choices=("postgresql", "sqlite"), help="bench one database")
    parser.add_argument(
        "--skip-index", action="store_true", help="leave the index check out of --section all"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--profile", action="store_true", help="also profile apply_batch (cProfile)"
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    quick = bool(args.quick)
    settings = Settings(
        rounds=args.rounds or (3 if quick else 5),
        small_rows=1000,
        big_rows=args.big_rows or (100_000 if quick else 1_000_000),
        probe_steps=100 if quick else 300,
        profile=bool(args.profile),
        batch_size=args.batch_size or 100,
        batch_tasks=args.tasks or (500 if quick else 3000),
    )
    if settings.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if settings.batch_size < 2 or settings.batch_tasks < settings.batch_size:
        raise SystemExit("--batch-size must be at least 2 and --tasks at least --batch-size")
    if settings.big_rows < 10 * settings.small_rows:
        raise SystemExit(f"--big-rows must be at least {10 * settings.small_rows:,}")
    return settings


def targets_of(args: argparse.Namespace) -> list[Target]:
    targets: list[Target] = []
    if args.only in (None, "postgresql"):
        # ANALYZE runs the statement, so the plan shown is the one taken; it is rolled back.
        pg = BenchDatabases(args.pg_url, (MAIN, BIG))
        targets.append(Target("postgresql", pg, "EXPLAIN (ANALYZE, COSTS OFF) ", 0))
    if args.only in (None, "sqlite"):
        files = SqliteFiles(args.sqlite_path, (MAIN, BIG))
        targets.append(Target("sqlite", files, "EXPLAIN QUERY PLAN ", 3))
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    sections = set(SECTIONS) if args.section == "all" else {args.section}
    if args.skip_index and args.section == "all":
        sections.discard("index")
    started = time.perf_counter()
    batch_rows: list[BatchThroughput] = []
    checks: list[IndexCheck] = []
    targets = targets_of(args)
    try:
        for target in targets if "batch" in sections else ():
            tasks = settings.batch_tasks - settings.batch_tasks % settings.batch_size
            say(
                f"{target.name}: {settings.rounds} rounds of {tasks:,} lone tasks "
                f"in batches of {settings.batch_size}"
            )
            batch_rows.append(measure_batches(target, settings))
            if settings.profile:
                profile_batches(target, settings)
        for target in targets if "index" in sections else ():
            sizes = f"~{settings.small_rows:,} vs ~{settings.big_rows:,} attempt rows"
            say(f"{target.name}: index check, {sizes}")
            checks.append(measure_index(target, settings))
        if batch_rows:
            report_batches(batch_rows)
        if checks:
            report_index(checks)
        say()
        say(f"done in {time.perf_counter() - started:.0f} s")
    finally:
        for target in targets:
            target.databases.drop()
    met = all(row.met for row in batch_rows) and all(c.flat and c.indexed for c in checks)
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
