"""The mirror's SQL write path against the raw-driver floor, on PostgreSQL and SQLite.

Run from the project root::

    python -m bench.store                    # both sections, a few minutes
    python -m bench.store --quick            # small numbers, under a minute
    python -m bench.store --section batch    # only the group commits

``batch``: the mirror's group commits (``apply_batch``, and the mirror end to end)
against the same DBAPI calls replayed on the raw driver. ``index``: one transition and
one ``get_step_state`` at about a thousand and about a million attempt rows, and the
query plans. Method, targets and figures: ``bench/README.md``, "Store benchmark".
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from bench.harness import options
from bench.harness.report import say
from bench.store.batches import BatchThroughput, measure_batches, profile_batches
from bench.store.index import IndexCheck, measure_index
from bench.store.report import report_batches, report_index
from bench.store.settings import settings_from
from bench.store.targets import BIG, MAIN, targets_of

SECTIONS: Final = ("batch", "index")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = options.parser(
        "store",
        "The mirror's group commits against the raw-driver floor, and the cost "
        "of a transition and of get_step_state at 1k vs 1M attempt rows.",
        quick="small numbers, under a minute",
        databases=(MAIN, BIG),
        rounds=(5, 3, "the median is reported"),
        check="exit 1 when a target is missed",
    )
    parser.add_argument(
        "--sqlite-path",
        type=Path,
        help="a new file for the SQLite database (default: one in a temporary directory); "
        "it and a -big sibling are deleted afterwards",
    )
    parser.add_argument(
        "--section",
        choices=("all", *SECTIONS),
        default="all",
        help="batch: group commits (apply_batch and the mirror); index: 1k vs 1M attempt rows",
    )
    parser.add_argument("--batch-size", type=int, help="lone tasks per group commit (default 100)")
    parser.size("--tasks", 3000, 500, "lone tasks per side per round (batch)")
    parser.size("--big-rows", 1_000_000, 100_000, "attempt rows for the large index sample")
    parser.add_argument("--only", choices=("postgresql", "sqlite"), help="bench one database")
    parser.add_argument(
        "--layout",
        choices=("plain", "partitioned"),
        default="plain",
        help="PostgreSQL's tables as they are, or laid out by day with a month of partitions",
    )
    parser.add_argument(
        "--skip-index", action="store_true", help="leave the index check out of --section all"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile apply_batch (cProfile)"
    )
    return parser.read(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    sections = set(SECTIONS) if args.section == "all" else {args.section}
    if args.skip_index and args.section == "all":
        sections.discard("index")
    started = time.perf_counter()
    batch_rows: list[BatchThroughput] = []
    checks: list[IndexCheck] = []
    targets = targets_of(args)
    try:
        for target in targets if "batch" in sections else ():
            tasks = settings.batch_tasks - settings.batch_tasks % settings.batch_size
            say(
                f"{target.name}: {settings.rounds} rounds of {tasks:,} lone tasks "
                f"in batches of {settings.batch_size}"
            )
            batch_rows.append(measure_batches(target, settings))
            if settings.profile:
                profile_batches(target, settings)
        for target in targets if "index" in sections else ():
            sizes = f"~{settings.small_rows:,} vs ~{settings.big_rows:,} attempt rows"
            say(f"{target.name}: index check, {sizes}")
            checks.append(measure_index(target, settings))
        if batch_rows:
            report_batches(batch_rows)
        if checks:
            report_index(checks)
        say()
        say(f"done in {time.perf_counter() - started:.0f} s")
    finally:
        for target in targets:
            target.databases.drop()
    met = all(row.met for row in batch_rows) and all(c.flat and c.indexed for c in checks)
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
