"""Plain-text tables of runs and attempts, for the terminal."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from pikku_celery.store import StepAttempt, WorkflowRun

__all__ = ["format_history", "format_runs", "table"]


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    body = [list(headers), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in body) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in body
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _time(value: dt.datetime | None) -> str:
    return "" if value is None else value.strftime("%H:%M:%S.%f")[:-3]


def _seconds(value: dt.timedelta | None) -> str:
    return "" if value is None else f"{value.total_seconds():.3f}s"


def _short(text: object, width: int = 48) -> str:
    one_line = " ".join(str(text).split())
    return one_line if len(one_line) <= width else one_line[: width - 1] + "…"


def format_runs(runs: Iterable[WorkflowRun]) -> str:
    return table(
        ["run", "workflow", "status", "created", "output / error"],
        [
            [
                run.run_id,
                run.workflow,
                run.status,
                run.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                _short(run.error.get("message") if run.error else run.output),
            ]
            for run in runs
        ],
    )


def format_history(attempts: Iterable[StepAttempt]) -> str:
    return table(
        ["step", "attempt", "status", "scheduled", "running", "ended", "took", "result / error"],
        [
            [
                a.step_name,
                str(a.attempt),
                a.status,
                _time(a.scheduled_at),
                _time(a.running_at),
                _time(a.ended_at),
                _seconds(a.duration),
                _short(f"{a.error.get('type')}: {a.error.get('message')}" if a.error else a.result),
            ]
            for a in attempts
        ],
    )
