"""The index check: a transition and ``get_step_state`` at about 1k and 1M attempt rows.

Both databases are timed in alternating blocks, and the plans of the
statements involved are taken on the large one.
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final

from bench.harness.report import say
from bench.harness.timing import timed
from bench.harness.turns import alternated
from bench.store.bulk_load import Bulk, count_rows
from bench.store.floor import Floor, capture_calls
from bench.store.lone_tasks import apply_batches, lone_task_batch, new_ids, transition
from bench.store.settings import Settings
from bench.store.targets import BIG, MAIN, Target
from pikku_celery.store import MirrorBatch, RunOutcome, WorkflowStore

# Above this, the 1M timing is no longer "the same" as the 1k one: a B-tree
# lookup gains a level or two over that range, a scan gains a thousandfold.
FLAT_LIMIT: Final = 1.5
WARMUP_STEPS: Final = 20
# Small blocks: the index probes need many turns to even out bursts of the machine.
PROBE_BLOCK_STEPS: Final = 10


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
            for probe in alternated(probes, block):
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
