"""The result backend bench's tables: one per measure, then pikku's ratios to the others."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Final

from bench.harness.cpu import PARTS
from bench.harness.report import best as pick
from bench.harness.report import fmt, ratio, say, table
from bench.result_backend.runs import Run, Settings

PART_SHORT: Final = {
    "this process": "client",
    "worker main": "wmain",
    "worker children": "wkids",
    "postgres": "pg",
    "redis": "redis",
    "other": "other",
    "postgres exited": "pg gone",
}
# Backends that ended during the run, any database's; already inside "other".
EXITED: Final = "postgres exited"


def p50(run: Run) -> float:
    return run.quantile(0.5) or 0.0


def elapsed(run: Run) -> float:
    return run.elapsed


def best(runs: Sequence[Run], backend: str, measure: str) -> Run | None:
    """The backend's best run of ``measure``: the shortest (for latency, the lowest p50)."""
    time: Callable[[Run], float] = p50 if measure == "latency" else elapsed
    return pick(
        runs, lambda run: (run.backend, run.measure) == (backend, measure), lambda run: -time(run)
    )


def every(runs: Sequence[Run], backend: str, measure: str, figure: Callable[[Run], str]) -> str:
    return " / ".join(
        figure(run) for run in runs if (run.backend, run.measure) == (backend, measure)
    )


def cpu_cells(run: Run) -> list[str]:
    per_item = run.cpu_ms_per_item()
    return [fmt(per_item.get(part, 0.0)) for part in (*PARTS, EXITED)]


def cpu_header(unit: str) -> list[str]:
    return [f"{PART_SHORT[part]} ms/{unit}" for part in (*PARTS, EXITED)]


def report_drain(runs: Sequence[Run], settings: Settings) -> None:
    say()
    say(
        f"1. Drain: {settings.counts['drain']:,} no-op tasks published one apply_async each, "
        f"until every result is ready; best of {settings.rounds}, {os.cpu_count()} CPUs; "
        "CPU ms per task of the best run"
    )
    rows = []
    for backend in settings.backends:
        top = best(runs, backend.key, "drain")
        if top is None:
            continue
        rows.append(
            [
                backend.label,
                f"{top.rate:.0f}",
                every(runs, backend.key, "drain", lambda run: f"{run.rate:.0f}"),
                f"{top.report['publish']:.2f}",
                f"{top.report['ready']:.2f}",
                *cpu_cells(top),
            ]
        )
    table(["backend", "tasks/s", "every round", "publish s", "ready s", *cpu_header("task")], rows)


def report_latency(runs: Sequence[Run], settings: Settings) -> None:
    say()
    say(
        f"2. get() latency: add.delay(i, i).get() {settings.counts['latency']:,} times in a row "
        f"on an idle worker; the round with the lowest p50 of {settings.rounds}"
    )
    rows = []
    for backend in settings.backends:
        top = best(runs, backend.key, "latency")
        if top is None:
            continue
        cells = [fmt(top.quantile(q), ".1f", 1000) for q in (0.5, 0.9, 0.99)]
        rows.append(
            [
                backend.label,
                *cells,
                every(
                    runs, backend.key, "latency", lambda run: fmt(run.quantile(0.5), ".1f", 1000)
                ),
                *cpu_cells(top),
            ]
        )
    table(["backend", "p50 ms", "p90 ms", "p99 ms", "p50 every round", *cpu_header("get")], rows)


def report_chord(runs: Sequence[Run], settings: Settings) -> None:
    say()
    size = settings.counts["chord"]
    say(
        f"3. Chord: {size:,} add headers and a total body, apply_async() to the body's value; "
        f"best of {settings.rounds}; CPU ms per header task"
    )
    rows = []
    for backend in settings.backends:
        top = best(runs, backend.key, "chord")
        if top is None:
            continue
        rows.append(
            [
                backend.label,
                f"{top.elapsed:.2f}",
                every(runs, backend.key, "chord", lambda run: f"{run.elapsed:.2f}"),
                f"{top.rate:.0f}",
                *cpu_cells(top),
            ]
        )
    table(["backend", "seconds", "every round", "headers/s", *cpu_header("header")], rows)


def report_expiry(runs: Sequence[Run], settings: Settings) -> None:
    if not settings.expiry:
        return
    say()
    say(
        f"4. Expiry: backend.cleanup() removing {settings.counts['expiry']:,} expired results "
        f"(1% more not yet expired stay); best of {settings.rounds}; CPU ms per 1,000 rows"
    )
    rows = []
    for backend in settings.expiry:
        top = best(runs, backend.key, "expiry")
        if top is None:
            continue
        per_1000 = {k: v * 1000 for k, v in top.cpu_ms_per_item().items()}
        rows.append(
            [
                backend.label,
                f"{top.elapsed * 1000:.0f}",
                every(runs, backend.key, "expiry", lambda run: f"{run.elapsed * 1000:.0f}"),
                fmt(per_1000.get("this process", 0.0)),
                fmt(per_1000.get("postgres", 0.0) + per_1000.get(EXITED, 0.0)),
            ]
        )
    table(["backend", "ms", "every round", "client ms/1k rows", "pg ms/1k rows"], rows)


def report_ratios(runs: Sequence[Run], settings: Settings) -> None:
    """pikku against each other backend: above 1 is pikku better on throughput, worse on times."""
    others = [b for b in settings.backends if b.key != "pikku"]
    if not others or len(others) == len(settings.backends):
        return
    say()
    say("pikku against the others (throughput: above 1 is pikku faster; times: above 1 is slower)")
    rows = []
    figures: list[tuple[str, str, Callable[[Run], float]]] = [
        ("drain tasks/s", "drain", lambda run: run.rate),
        ("get() p50", "latency", p50),
        ("get() p99", "latency", lambda run: run.quantile(0.99) or 0.0),
        ("chord seconds", "chord", elapsed),
        ("cleanup seconds", "expiry", elapsed),
    ]
    for label, measure, figure in figures:
        mine = best(runs, "pikku", measure)
        if mine is None:
            continue
        rows.append(
            [label, *(fmt(ratio(mine, best(runs, b.key, measure), figure)) for b in others)]
        )
    table(["figure", *(f"pikku/{b.key}" for b in others)], rows)
