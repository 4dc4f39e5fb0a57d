"""The Celery bench's result tables: rates and CPU, ratios against the targets, the
mirror's delivery, and the pools side by side."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final

from bench.harness.cpu import PARTS
from bench.harness.report import best as best_of
from bench.harness.report import fmt, ratio, say, table, verdict
from bench.throughput.app import SCENARIOS, VARIANT_LABELS, VARIANTS
from bench.throughput.pools import POOL_LABELS, POOL_SCENARIOS, POOLS
from bench.throughput.runner import Settings
from bench.throughput.runs import Run

TARGET_OF_PLAIN: Final = 0.8
AIM_OF_PLAIN: Final = 0.9
TARGET_OF_DBBACKEND: Final = 3.0
TARGET_LAG_P99: Final = 0.100
TARGET_COMMITS: Final = 0.3

PART_SHORT: Final = {
    "this process": "pub",
    "worker main": "wmain",
    "worker children": "wkids",
    "postgres": "pg",
    "redis": "redis",
    "other": "other",
}


def rate_of(run: Run) -> float:
    return run.rate


def best(runs: Sequence[Run], scenario: str, variant: str, pool: str = "prefork") -> Run | None:
    return best_of(
        runs,
        lambda run: (run.scenario, run.variant, run.pool) == (scenario, variant, pool),
        rate_of,
    )


def ceiling_of(run: Run) -> float:
    return run.ceiling


def report_runs(runs: Sequence[Run], settings: Settings) -> None:
    say()
    say(
        f"Tasks per second, {settings.tasks:,} tasks per run, best of {settings.rounds}, "
        f"{os.cpu_count()} CPUs; CPU ms per task of the best run by process"
    )
    rows: list[list[str]] = []
    for pool in POOLS:
        for scenario in SCENARIOS:
            for variant in VARIANTS:
                top = best(runs, scenario.key, variant, pool)
                if top is None:
                    continue
                every = [
                    f"{run.rate:.0f}"
                    for run in runs
                    if (run.scenario, run.variant, run.pool) == (scenario.key, variant, pool)
                ]
                cpu = [f"{top.cpu.get(name, 0.0) / top.tasks * 1000:.2f}" for name in PARTS]
                rows.append(
                    [
                        pool,
                        scenario.label,
                        VARIANT_LABELS[variant],
                        f"{top.rate:.1f}",
                        "/".join(every),
                        *cpu,
                        f"{top.cpu_ms:.2f}",
                        f"{top.ceiling:.0f}",
                        fmt(top.commits_per_task),
                    ]
                )
    header = [
        "pool", "scenario", "variant", "tasks/s", "rounds",
        *(f"{PART_SHORT[name]} ms" for name in PARTS),
        "bench ms", "CPU-bound/s", "commits/task",
    ]  # fmt: skip
    table(header, rows)
    say(
        "(pub = publisher, wmain/wkids = worker main process/pool children, other = CPU "
        "spent outside the bench; 'bench ms' sums the bench's own processes and "
        "'CPU-bound/s' is what that cost allows with every CPU on it; commits/task is "
        "xact_commit of the scenario's database over the worker's life, warm-up included)"
    )


def report_ratios(runs: Sequence[Run]) -> list[str]:
    """The ratio table; returns the targets missed."""
    say()
    say(
        f"Ratios, prefork: c/a >= {TARGET_OF_PLAIN} (aim {AIM_OF_PLAIN}), the same with "
        f"task events on for both, c/b >= {TARGET_OF_DBBACKEND:g}; c/d reported"
    )
    missed: list[str] = []
    rows = []
    for variant in VARIANTS:
        got = {scenario.short: best(runs, scenario.key, variant) for scenario in SCENARIOS}
        of_plain = ratio(got["c"], got["a"], rate_of)
        with_events = ratio(got["c+e"], got["a+e"], rate_of)
        of_db = ratio(got["c"], got["b"], rate_of)
        of_redis = ratio(got["c"], got["d"], rate_of)
        for name, value, target in (
            ("c/a", of_plain, TARGET_OF_PLAIN),
            ("(c+e)/(a+e)", with_events, TARGET_OF_PLAIN),
            ("c/b", of_db, TARGET_OF_DBBACKEND),
        ):
            if verdict(value, target) == "MISSED":
                missed.append(f"{VARIANT_LABELS[variant]} {name} {value:.2f} < {target:g}")
        rows.append(
            [
                VARIANT_LABELS[variant],
                fmt(of_plain),
                verdict(of_plain, TARGET_OF_PLAIN),
                fmt(with_events),
                verdict(with_events, TARGET_OF_PLAIN),
                fmt(of_db),
                verdict(of_db, TARGET_OF_DBBACKEND),
                fmt(of_redis),
                fmt(ratio(got["c"], got["a"], ceiling_of)),
                fmt(ratio(got["c"], got["b"], ceiling_of)),
                fmt(ratio(got["s"], got["a"], rate_of)),
            ]
        )
    table(
        [
            "variant", "c/a", f">= {TARGET_OF_PLAIN}", "(c+e)/(a+e)", f">= {TARGET_OF_PLAIN}",
            "c/b", f">= {TARGET_OF_DBBACKEND:g}", "c/d", "c/a by CPU", "c/b by CPU", "s/a",
        ],
        rows,
    )  # fmt: skip
    return missed


def report_delivery(runs: Sequence[Run]) -> list[str]:
    """The mirror's lag and commits per task; returns the targets missed."""
    say()
    say(
        f"Mirror delivery of the best runs: lag from event to the COMMIT of its batch "
        f"(p99 <= {TARGET_LAG_P99 * 1000:.0f} ms), SQL commits per task (<= {TARGET_COMMITS})"
    )
    missed: list[str] = []
    rows = []
    for pool in POOLS:
        for scenario in SCENARIOS:
            if not scenario.mirror:
                continue
            for variant in VARIANTS:
                top = best(runs, scenario.key, variant, pool)
                if top is None or top.delivery is None:
                    continue
                d = top.delivery
                p99 = d.lag(0.99)
                commits = top.commits_per_task
                label = f"{pool} {scenario.short} {VARIANT_LABELS[variant]}"
                if verdict(p99, TARGET_LAG_P99, at_most=True) == "MISSED" and p99 is not None:
                    missed.append(
                        f"{label}: lag p99 {p99 * 1000:.1f} ms > {TARGET_LAG_P99 * 1000:.0f} ms"
                    )
                if verdict(commits, TARGET_COMMITS, at_most=True) == "MISSED":
                    missed.append(f"{label}: {commits:.3f} commits/task > {TARGET_COMMITS}")
                rows.append(
                    [
                        pool,
                        scenario.label,
                        VARIANT_LABELS[variant],
                        f"{top.settle * 1000:.0f}",
                        fmt(d.lag(0.5), ".1f", 1000),
                        fmt(p99, ".1f", 1000),
                        fmt(max(d.lags) if d.lags else None, ".1f", 1000),
                        verdict(p99, TARGET_LAG_P99, at_most=True),
                        str(d.processes),
                        f"{d.appended}/{d.written}" if d.available else "n/a",
                        fmt(top.batches_per_task, ".3f"),
                        fmt(commits, ".3f"),
                        verdict(commits, TARGET_COMMITS, at_most=True),
                    ]
                )
    table(
        [
            "pool", "scenario", "variant", "settle ms", "lag p50 ms", "lag p99 ms",
            "lag max ms", "p99", "procs", "appended/written", "batches/task",
            "commits/task", "commits",
        ],
        rows,
    )  # fmt: skip
    say(
        "(settle = SQL showing every step succeeded, minus the worker counting its last "
        "task; lags and batches are the timed run's, summed over the publisher and every "
        "worker process; n/a = the mirror has no stats())"
    )
    return missed


def report_pools(runs: Sequence[Run], settings: Settings) -> None:
    if len(settings.pools) < 2:
        return
    say()
    say("No-op tasks by pool: tasks/s (best), c/a and c/b")
    rows = []
    for pool in settings.pools:
        plain, dbbackend, pikku = (best(runs, key, "noop", pool) for key in POOL_SCENARIOS)
        rows.append(
            [
                POOL_LABELS[pool],
                *(fmt(run.rate if run else None, ".1f") for run in (plain, dbbackend, pikku)),
                fmt(ratio(pikku, plain, rate_of)),
                verdict(ratio(pikku, plain, rate_of), TARGET_OF_PLAIN),
                fmt(ratio(pikku, dbbackend, rate_of)),
                verdict(ratio(pikku, dbbackend, rate_of), TARGET_OF_DBBACKEND),
                fmt(pikku.cpu_ms if pikku else None),
            ]
        )
    table(
        [
            "pool", "(a)/s", "(b)/s", "(c)/s", "c/a", f">= {TARGET_OF_PLAIN}",
            "c/b", f">= {TARGET_OF_DBBACKEND:g}", "(c) bench ms",
        ],
        rows,
    )  # fmt: skip
