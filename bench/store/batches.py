"""Group commits: lone tasks through ``apply_batch``, the whole mirror and the raw-driver floor.

A batch is B lone tasks (see ``bench.store.lone_tasks``). The three paths take
turns batch by batch, so a slow spell of the machine lands on each alike.
"""

from __future__ import annotations

import cProfile
import datetime as dt
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final

from bench.harness.profiling import say_profile
from bench.harness.report import say
from bench.harness.timing import timed
from bench.harness.turns import rotated
from bench.store.floor import CapturedBatch, Floor, capture_calls
from bench.store.lone_tasks import (
    TASK_TRANSITIONS,
    apply_batches,
    lone_task_batch,
    mirror_tasks,
    new_ids,
    published_steps,
)
from bench.store.settings import Settings
from bench.store.targets import MAIN, Target
from pikku_celery.mirror import Recorder
from pikku_celery.store import WorkflowStore

TARGET_RATIO: Final = 0.7
# Each side's runs carry their own workflow name, so each side's rows can be counted.
BATCH_SIDES: Final = ("apply_batch", "mirror", "floor")


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
        mirror = Recorder(
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
                    for side, action in rotated(actions, round_no + block):
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
