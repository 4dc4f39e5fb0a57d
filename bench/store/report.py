"""The store bench's result tables: group commits, then the index check and its plans."""

from __future__ import annotations

from collections.abc import Sequence

from bench.harness.report import fmt, say, table, verdict
from bench.store.batches import TARGET_RATIO, BatchThroughput
from bench.store.index import FLAT_LIMIT, IndexCheck
from bench.store.lone_tasks import TASK_TRANSITIONS


def report_batches(rows: Sequence[BatchThroughput]) -> None:
    say()
    say(
        "Group commits: lone tasks per second (median of rounds; one transaction per "
        f"batch; {TASK_TRANSITIONS} transitions per task: publish, running, succeeded)"
    )
    lines: list[list[str]] = []
    for row in rows:
        floor = row.tasks("floor")
        for side in ("apply_batch", "mirror"):
            gated = side == "apply_batch"
            lines.append(
                [
                    row.database,
                    side if gated else "mirror+journal",
                    str(row.batch_size),
                    str(row.statements),
                    f"{row.tasks(side):,.0f}",
                    f"{floor:,.0f}",
                    f"{row.ratio(side):.3f}",
                    verdict(row.ratio(side), TARGET_RATIO) if gated else "-",
                    f"{row.overhead_us(side):.1f}",
                ]
            )
    header = [
        "database", "path", "batch", "calls/batch", "tasks/s", "floor tasks/s",
        "path/floor", f">= {TARGET_RATIO}", "µs/task extra",
    ]  # fmt: skip
    table(header, lines)


def report_index(checks: Sequence[IndexCheck]) -> None:
    say()
    say("Index check (median µs per call; a transition is a batch of one)")
    rows: list[list[str]] = []
    for check in checks:
        for sample in (check.small, check.big):
            rows.append(
                [
                    check.database,
                    f"{sample.history_rows:,}",
                    f"{sample.step_rows:,}",
                    fmt(sample.transition_us, ".1f"),
                    fmt(sample.get_step_state_us, ".1f"),
                ]
            )
        rows.append(
            [check.database, "ratio", "", fmt(check.transition_ratio), fmt(check.get_ratio)]
        )
    table(["database", "attempt rows", "step rows", "transition", "get_step_state"], rows)
    for check in checks:
        say()
        indexed = "every plan uses an index" if check.indexed else "A PLAN SCANS A TABLE"
        flat = "flat" if check.flat else f"NOT flat (limit {FLAT_LIMIT})"
        say(f"{check.database}, {check.big.history_rows:,} attempt rows: {indexed}; cost {flat}")
        for label, lines in check.plans:
            say(f"  {label}")
            for line in lines:
                say(f"    {line}")
