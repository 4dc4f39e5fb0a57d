"""Plain-text tables of runs and attempts, for the terminal."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pikku_celery.render.documents import run_parent, step_wait, steps_after
from pikku_celery.store import RunEvent, StepAttempt, StepState, WorkflowRun

__all__ = ["format_events", "format_history", "format_run", "format_runs", "table"]


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
                _short(run.error.get("message") if run.error else _json(run.output)),
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
                _short(_error(a.error) if a.error else _json(a.result)),
            ]
            for a in attempts
        ],
    )


def _json(value: Any) -> str:
    """A stored value as JSON, as ``--json`` and the dashboard show it (never a Python repr)."""
    return "" if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _traceback(error: Mapping[str, Any] | None, indent: str = "    ") -> list[str]:
    text = (error or {}).get("traceback")
    if not isinstance(text, str) or not text.strip():
        return []
    return [indent + line for line in text.rstrip().splitlines()]


def _error(error: Mapping[str, Any] | None) -> str:
    if not error:
        return ""
    # A Pikku error names its kind by ``code`` and has no ``type``.
    kind, message = error.get("type") or error.get("code"), error.get("message")
    return f"{kind}: {message}" if kind else str(message)


def _when(value: dt.datetime | None, day: dt.date) -> str:
    """Time of day on the run's first day; the date too once a run spans days (a long sleep)."""
    if value is None:
        return ""
    if value.date() == day:
        return _time(value)
    return value.strftime("%m-%d ") + _time(value)


def _utc(value: dt.datetime) -> str:
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _step_detail(step: StepState) -> str:
    """What a durable workflow adds to a step: its child run, its wait, its branch."""
    parts = []
    if step.child_run_id is not None:
        parts.append(f"child run {step.child_run_id}")
    wait = step_wait(step)
    if wait is not None:
        until = "" if wait.deadline is None else f" until {_utc(wait.deadline)}"
        waited = "waiting" if wait.waiting else "waited"
        parts.append(f"{waited} for event {wait.event}{until if wait.waiting else ''}")
    if step.branch_taken is not None:
        parts.append(f"branch taken: {step.branch_taken}")
    return "; ".join(parts)


def format_events(events: Iterable[RunEvent], steps: Iterable[StepState], day: dt.date) -> str:
    """The events sent to a run, oldest first, and which wait took each."""
    names = {step.step_id: step.step_name for step in steps}
    return table(
        ["event", "sent", "taken by", "taken", "data"],
        [
            [
                e.name,
                _when(e.sent_at, day),
                "not taken yet"
                if e.taken_by_step_id is None
                else names.get(e.taken_by_step_id, e.taken_by_step_id),
                _when(e.taken_at, day),
                _short(json.dumps(e.data, ensure_ascii=False, sort_keys=True), 60),
            ]
            for e in events
        ],
    )


def format_run(
    run: WorkflowRun,
    steps: Sequence[StepState],
    attempts: Sequence[StepAttempt],
    events: Sequence[RunEvent] = (),
    celery_states: Mapping[str, str] | None = None,
) -> str:
    """One run for ``pikku-celery runs show``: the run, its steps, every attempt, every error,
    and the events sent to it. ``celery_states``: each step's state in Celery's result
    backend, when it is this store (a column only then)."""
    day = run.created_at.date()
    parent = run_parent(run)
    header = table(
        ["run", run.run_id],
        [
            ["workflow", run.workflow],
            *(
                []
                if parent is None
                else [["parent", f"run {parent.run_id}, step {parent.step_name or parent.step_id}"]]
            ),
            ["status", run.status],
            ["created", run.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")],
            ["updated", run.updated_at.strftime("%Y-%m-%d %H:%M:%S UTC")],
            ["input", _short(_json(run.input), 100)],
            ["output", _short(_json(run.output), 100)],
            # Whole, as the dashboard shows it: a run with no steps has no other place for it.
            ["error", " ".join(_error(run.error).split())],
        ],
    )
    parts = [header]
    if steps:
        after = steps_after(run, steps, attempts)
        details = [_step_detail(s) for s in steps]
        # Only durable workflows' steps have details; other runs' tables stay as they were.
        extra = ["detail"] if any(details) else []
        states = celery_states or {}
        # Celery's own word beside the history's, for an app whose result backend is
        # this store: "scheduled" here is PENDING there, "lost" may be STARTED.
        celery = ["celery"] if states else []
        parts.append(
            "steps\n"
            + table(
                ["step", "task", "status", *celery, "attempts", "after", *extra],
                [
                    [
                        s.step_name,
                        s.rpc_name or "",
                        s.status,
                        *([states.get(s.step_id, "")] if celery else []),
                        str(s.attempt_count),
                        ", ".join(after[s.step_id]),
                        *([detail] if extra else []),
                    ]
                    for s, detail in zip(steps, details, strict=True)
                ],
            )
        )
    if attempts:
        parts.append(
            f"attempts (times UTC, {day.isoformat()})\n"
            + table(
                [
                    "step",
                    "#",
                    "status",
                    "reason",
                    "scheduled",
                    "eta",
                    "running",
                    "ended",
                    "took",
                    "worker",
                    "pid",
                    "deliveries",
                    "error",
                ],
                [
                    [
                        a.step_name,
                        str(a.attempt),
                        a.status,
                        a.reason or "",
                        _when(a.scheduled_at, day),
                        _when(a.eta, day),
                        _when(a.running_at, day),
                        _when(a.ended_at, day),
                        _seconds(a.duration),
                        a.worker or "",
                        "" if a.pid is None else str(a.pid),
                        str(a.delivery_count),
                        _short(_error(a.error), 40),
                    ]
                    for a in attempts
                ],
            )
        )
    errors = [a for a in attempts if a.error]
    run_traceback = _traceback(run.error)
    if errors or run_traceback:
        # The table cuts messages short; here each is whole, its traceback indented under it.
        lines = []
        if run_traceback:
            lines.append(f"run: {' '.join(_error(run.error).split())}")
            lines.extend(run_traceback)
        for a in errors:
            lines.append(f"{a.step_name} #{a.attempt}: {' '.join(_error(a.error).split())}")
            lines.extend(_traceback(a.error))
        parts.append("errors\n" + "\n".join(lines))
    if events:
        parts.append(f"events (times UTC, {day.isoformat()})\n" + format_events(events, steps, day))
    return "\n\n".join(parts)
