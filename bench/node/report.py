"""The node bench's tables: drain rates and CPU by process, the ``.delay()`` rates, the ratios
against their targets, and the mirror's delivery during the drains."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from bench.harness.report import best, fmt, ratio, say, table, verdict
from bench.node.cpus import SERVER_CPU, WORKER_CPU
from bench.node.runs import DELAY_MODES, MODE_LABELS, MODES, DelayRun, DrainRun, Settings
from bench.node.threads import SIDE_THREADS
from bench.throughput.app import VARIANT_LABELS, VARIANTS

DRAIN_OF_PLAIN: Final = 0.95
DELAY_OF_PLAIN: Final = 0.9
DRAIN_OF_REDIS: Final = 1.2
DRAIN_OF_DB: Final = 3.5


def _rate(run: DrainRun | DelayRun) -> float:
    return run.rate


def best_drain(runs: Sequence[DrainRun], mode: str, variant: str) -> DrainRun | None:
    return best(runs, lambda run: (run.mode, run.variant) == (mode, variant), _rate)


def best_delay(runs: Sequence[DelayRun], mode: str) -> DelayRun | None:
    return best(runs, lambda run: run.mode == mode, _rate)


def _rate_from_start(run: DrainRun) -> float:
    return run.rate_from_start


def _drain_cpu(run: DrainRun) -> float:
    return run.cpu_ms


def _loop_cpu(run: DelayRun) -> float:
    return run.loop_us


def report_drains(runs: Sequence[DrainRun], settings: Settings) -> None:
    if not runs:
        return
    say()
    say(
        f"Drain of {settings.tasks:,} queued tasks by prefork -c 2 on CPU {WORKER_CPU} "
        f"(PostgreSQL, Redis and the publisher on CPU {SERVER_CPU}); tasks/s from the first "
        f"task, best of {settings.rounds}; CPU ms per task of the best run by process"
    )
    rows: list[list[str]] = []
    for variant in VARIANTS:
        for mode in MODES:
            top = best_drain(runs, mode, variant)
            if top is None:
                continue
            every = [
                f"{run.rate:.0f}" for run in runs if (run.mode, run.variant) == (mode, variant)
            ]
            rows.append(
                [
                    MODE_LABELS[mode],
                    VARIANT_LABELS[variant],
                    f"{top.rate:.1f}",
                    "/".join(every),
                    f"{top.rate_from_start:.1f}",
                    f"{top.startup:.2f}",
                    f"{top.fill_ms:.2f}",
                    f"{top.ms('worker main'):.2f}",
                    f"{top.ms(SIDE_THREADS):.2f}",
                    *(f"{top.ms(part):.2f}" for part in ("worker children", "postgres", "redis")),
                    f"{top.cpu_ms:.2f}",
                    f"{top.ms('this process'):.2f}",
                    f"{top.ms('other'):.2f}",
                ]
            )
    table(
        [
            "mode", "variant", "tasks/s", "rounds", "from start/s", "start-up s", "pub ms",
            "wmain ms", "of it thr", "wkids ms", "pg ms", "redis ms", "drain ms", "poll ms",
            "other ms",
        ],
        rows,
    )  # fmt: skip
    say(
        "(from start = tasks/s counted from the worker's launch; pub = the publisher's CPU "
        "filling the queue before the worker started; wmain/wkids = worker main process/pool "
        "processes, of it thr = wmain's threads but its main one (the mirror's flusher); "
        "drain ms sums wmain, wkids, pg and redis; poll = the bench waiting for the worker's "
        "count and polling SQL; other = CPU spent outside the bench)"
    )


def report_delays(runs: Sequence[DelayRun], settings: Settings) -> None:
    if not runs:
        return
    say()
    say(
        f".delay() in one publisher process on CPU {WORKER_CPU} (servers on CPU {SERVER_CPU}), "
        f"{settings.calls:,} calls, best of {settings.rounds}; CPU µs per call of the best run"
    )
    rows = []
    for mode in DELAY_MODES:
        top = best_delay(runs, mode)
        if top is None:
            continue
        rows.append(
            [
                MODE_LABELS[mode],
                f"{top.rate:.0f}",
                "/".join(f"{run.rate:.0f}" for run in runs if run.mode == mode),
                f"{top.loop_us:.1f}",
                f"{top.loop_threads_us:.1f}",
                f"{top.us('this process'):.1f}",
                f"{(top.written - top.loop) * 1000:.0f}",
                f"{top.us('postgres'):.1f}",
                f"{top.us('redis'):.1f}",
            ]
        )
    table(
        [
            "mode", "calls/s", "rounds", "pub µs (loop)", "of it thr", "pub µs (to written)",
            "tail ms", "pg µs", "redis µs",
        ],
        rows,
    )  # fmt: skip
    say(
        "(pub µs (loop) = the publisher's CPU during the calls, of it thr = its threads but "
        "the calling one (the mirror's flusher); (to written) also until its "
        "mirror had written every call, tail ms after the loop; pg and redis until written)"
    )


def report_ratios(drains: Sequence[DrainRun], delays: Sequence[DelayRun]) -> list[str]:
    """The ratios the mirror is held to; returns the targets missed."""
    say()
    say(
        f"Targets: drain mirror/plain >= {DRAIN_OF_PLAIN}, mirror/Redis backend >= "
        f"{DRAIN_OF_REDIS}, mirror/db+ >= {DRAIN_OF_DB}; .delay() mirror/plain >= "
        f"{DELAY_OF_PLAIN}"
    )
    missed: list[str] = []
    rows: list[list[str]] = []

    def row(what: str, value: float | None, target: float, *extra: str) -> None:
        if verdict(value, target) == "MISSED" and value is not None:
            missed.append(f"{what} {value:.2f} < {target:g}")
        rows.append([what, fmt(value), f">= {target:g}", verdict(value, target), *extra])

    for variant in VARIANTS if drains else ():
        got = {mode: best_drain(drains, mode, variant) for mode in MODES}
        mirror = got["mirror"]
        label = VARIANT_LABELS[variant]
        for mode, name, target in (
            ("plain", "plain", DRAIN_OF_PLAIN),
            ("redis", "Redis", DRAIN_OF_REDIS),
            ("db", "db+", DRAIN_OF_DB),
        ):
            other = got[mode]
            if other is None:
                continue
            row(
                f"drain {label}: mirror/{name}",
                ratio(mirror, other, _rate),
                target,
                fmt(ratio(mirror, other, _rate_from_start)),
                # By CPU: the other side's CPU per task over the mirror's, so above 1 is
                # the mirror cheaper, as for the rates.
                fmt(ratio(other, mirror, _drain_cpu)),
            )
    if delays:
        mirror_delay, plain_delay = best_delay(delays, "mirror"), best_delay(delays, "plain")
        row(
            ".delay(): mirror/plain",
            ratio(mirror_delay, plain_delay, _rate),
            DELAY_OF_PLAIN,
            "",
            fmt(ratio(plain_delay, mirror_delay, _loop_cpu)),
        )
    table(["ratio", "value", "target", "", "from start", "by CPU"], rows)
    say(
        "(from start = the same ratio with the drains timed from the worker's launch; by "
        "CPU = the other side's CPU per task (drain ms; .delay(): pub µs in the loop) over "
        "the mirror's)"
    )
    return missed


def report_delivery(runs: Sequence[DrainRun]) -> None:
    rows = []
    for variant in VARIANTS:
        top = best_drain(runs, "mirror", variant)
        if top is None or top.delivery is None:
            continue
        d = top.delivery
        rows.append(
            [
                VARIANT_LABELS[variant],
                f"{(top.drain - top.worker_drain) * 1000:.0f}",
                str(d.processes),
                f"{d.appended}/{d.written}" if d.available else "n/a",
                fmt(d.batches / top.tasks if d.available else None, ".3f"),
                fmt(d.lag(0.5), ".1f", 1000),
                fmt(d.lag(0.99), ".1f", 1000),
            ]
        )
    if not rows:
        return
    say()
    say("The mirror during its best drains (the worker's processes)")
    table(
        [
            "variant", "settle ms", "procs", "appended/written", "batches/task",
            "lag p50 ms", "lag p99 ms",
        ],
        rows,
    )  # fmt: skip
    say("(settle = SQL showing every step succeeded, minus the worker counting its last task)")
