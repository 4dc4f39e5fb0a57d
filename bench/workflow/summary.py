"""What the runs of one kind add up to, per step, and whether they did what they should."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.harness.timing import p90
from bench.workflow.runs import RunResult, Tally
from bench.workflow.sql_counts import Counts


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
