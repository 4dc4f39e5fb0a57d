"""The retirement bench's table, in Markdown: each step, and each side's total."""

from __future__ import annotations

from collections.abc import Sequence

from bench.harness.report import say
from bench.retention.measure import Step

__all__ = ["report"]

_HEADER = (
    "side",
    "step",
    "runs retired",
    "seconds",
    "WAL bytes",
    "WAL bytes a run",
    "table+index bytes before",
    "after",
    "dead tuples left",
)


def _mib(value: int) -> str:
    return f"{value / 2**20:,.1f} MiB"


def _row(step: Step, *, bold: bool = False) -> list[str]:
    cells = [
        step.side,
        step.what,
        f"{step.runs:,}",
        f"{step.seconds:,.2f}",
        f"{step.wal_bytes:,}",
        f"{step.wal_bytes / step.runs:,.0f}" if step.runs else "",
        _mib(step.bytes_before),
        _mib(step.bytes_after),
        "" if step.dead_tuples is None else f"{step.dead_tuples:,}",
    ]
    if bold:
        cells[1:6] = [f"**{cell}**" if cell else cell for cell in cells[1:6]]
    return cells


def _total(side: str, steps: Sequence[Step]) -> Step:
    return Step(
        side,
        "total",
        max(step.runs for step in steps),
        sum(step.seconds for step in steps),
        sum(step.wal_bytes for step in steps),
        steps[0].bytes_before,
        steps[-1].bytes_after,
    )


def report(steps: Sequence[Step]) -> None:
    """A row a step, and a bold total for each side of more than one step."""
    rows: list[list[str]] = []
    sides = list(dict.fromkeys(step.side for step in steps))
    for side in sides:
        mine = [step for step in steps if step.side == side]
        rows += [_row(step) for step in mine]
        if len(mine) > 1:
            rows.append(_row(_total(side, mine), bold=True))
    say("| " + " | ".join(_HEADER) + " |")
    say("|" + "---|" + "---:|" * (len(_HEADER) - 1))
    for row in rows:
        say("| " + " | ".join(row) + " |")
