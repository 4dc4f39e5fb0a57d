"""The ceiling bench's tables: PostgreSQL's cost per task, the ceiling, the bytes kept."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from bench.ceiling.app import WORKLOADS
from bench.ceiling.figures import Figures
from bench.ceiling.runs import Run
from bench.harness.report import say, table

__all__ = ["report"]

#: The PostgreSQL the page extrapolates to.
BIG_SERVER_CORES = 16


def _median(runs: Sequence[Run], measure: str) -> float:
    return median(float(getattr(run.figures, measure)) for run in runs)


def _spread(values: Sequence[float], spec: str) -> str:
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(min(values), spec)}-{format(max(values), spec)}"


def report(runs: Sequence[Run]) -> None:
    """Per workload, the median of its rounds (and their range where there are several)."""
    say()
    say("PostgreSQL per task (all its processes; median of the rounds, their range after it):")
    rows = []
    kept_rows = []
    tables = sorted({name for run in runs for name in run.figures.table_bytes})
    for workload in WORKLOADS:
        mine = [run for run in runs if run.workload == workload]
        if not mine:
            continue
        cpu = [run.figures.cpu_ms for run in mine]
        cpu_ms = median(cpu)
        per_core = 1000 / cpu_ms if cpu_ms else float("inf")
        rows.append([
            workload.label,
            f"{mine[0].figures.tasks:,}",
            f"{_median(mine, 'rate'):.0f}",
            f"{cpu_ms:.3f}",
            _spread(cpu, ".3f"),
            f"{per_core:,.0f}",
            f"{per_core * BIG_SERVER_CORES:,.0f}",
            f"{_median(mine, 'commits'):.3f}",
            f"{_median(mine, 'wal_bytes'):,.0f}",
            f"{_median(mine, 'notifies'):.3f}",
            f"{_median(mine, 'kept_bytes'):,.0f}",
        ])  # fmt: skip
        kept_rows.append(
            [workload.label]
            + [f"{median(r.figures.table_bytes.get(t, 0.0) for r in mine):,.0f}" for t in tables]
        )
    table(
        ["workload", "tasks", "tasks/s", "CPU ms", "rounds", "tasks/s/core",
         f"x{BIG_SERVER_CORES} cores", "commits", "WAL bytes", "NOTIFYs", "bytes kept"],
        rows,
    )  # fmt: skip
    say()
    say("Bytes kept per task by table (pg_total_relation_size: heap, TOAST and indexes):")
    table(["workload", *tables], kept_rows)
    say()
    say(
        "A chord's task is one of its 21 (20 header tasks and the body): per chord, 21 times "
        f"the figures. x{BIG_SERVER_CORES} cores is tasks/s/core times {BIG_SERVER_CORES}: "
        "a linear extrapolation, not a measurement."
    )
    for run in runs:
        _load_line(run.workload.label, run.figures, run.load_before, run.load_after)


def _load_line(
    label: str,
    figures: Figures,
    before: tuple[float, float, float],
    after: tuple[float, float, float],
) -> None:
    say(
        f"  {label}: {figures.seconds:.1f} s, load average {before[0]:.2f} before, "
        f"{after[0]:.2f} after"
    )
