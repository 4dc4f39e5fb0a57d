"""``pikku-celery prune``: delete old settled runs in batches."""

from __future__ import annotations

import argparse
import os
from typing import Any, Final

from pikku_celery.cli.common import EXIT_OK, env_help, store_of
from pikku_celery.cli.options import env_flag, int_between, listed, parse_age
from pikku_celery.cli.progress import Progress
from pikku_celery.errors import ConfigurationError, InvalidStatus
from pikku_celery.store import (
    DEFAULT_PRUNE_STATUSES,
    RUN_STATUSES,
    SETTLED_RUN_STATUSES,
    PruneCount,
    now,
)

__all__ = ["add_prune_command"]

ENV_PRUNE_STATUS: Final = "PIKKU_PRUNE_STATUS"


def cmd_prune(args: argparse.Namespace) -> int:
    statuses = listed(args.status, ENV_PRUNE_STATUS) or list(DEFAULT_PRUNE_STATUSES)
    try:
        before = now() - args.older_than
    except OverflowError:
        raise ConfigurationError(
            "--older-than reaches before year 1; give a smaller age."
        ) from None
    for status in statuses:  # a typo is reported before the database is even looked for
        if status not in SETTLED_RUN_STATUSES:
            kind = "prunable run" if status in RUN_STATUSES else "run"
            raise InvalidStatus(kind, status, SETTLED_RUN_STATUSES)
    scope = f"{'/'.join(sorted(set(statuses)))} runs created before {before:%Y-%m-%d %H:%M:%S} UTC"
    store = store_of(args)
    try:
        if args.dry_run:
            found = store.count_prunable(before, statuses)
            print(f"Would prune {_tally(found)}: {scope}. Nothing was deleted (--dry-run).")
            return EXIT_OK
        batches = 0
        with Progress(store.count_prunable_runs(before, statuses), "runs") as bar:

            def committed(total: PruneCount) -> None:
                nonlocal batches
                batches += 1
                bar.update(total.runs)

            pruned = store.prune(before, statuses, batch_size=args.batch_size, on_batch=committed)
    finally:
        store.close()
    print(
        f"Pruned {_tally(pruned)}: {scope}, in {batches} "
        f"{'batch' if batches == 1 else 'batches'} of at most {args.batch_size} runs."
    )
    return EXIT_OK


def _tally(count: PruneCount) -> str:
    return f"{count.runs} runs ({count.steps} steps, {count.attempts} attempts)"


def add_prune_command(commands: Any) -> None:
    prune = commands.add_parser(
        "prune",
        help="delete old settled runs in batches",
        description="Delete runs that ended (completed, failed, cancelled) longer ago than "
        "--older-than, with their steps and attempts, one transaction per batch.",
    )
    older_than = os.environ.get("PIKKU_PRUNE_OLDER_THAN") or None
    prune.add_argument(
        "--older-than",
        metavar="AGE",
        type=parse_age,
        default=older_than,
        required=older_than is None,
        help=env_help(
            "runs created longer ago than this: 30d, 12h, 90m, 45s", "PIKKU_PRUNE_OLDER_THAN"
        ),
    )
    prune.add_argument(
        "--status",
        action="append",
        metavar="STATUS",
        help=env_help(
            "only runs in this status (repeat, or comma-separate; default "
            f"{', '.join(DEFAULT_PRUNE_STATUSES)})",
            ENV_PRUNE_STATUS,
        ),
    )
    prune.add_argument(
        "--batch-size",
        type=int_between(1, 100_000),
        default=os.environ.get("PIKKU_PRUNE_BATCH_SIZE", "500"),
        help=env_help("runs per transaction (default 500)", "PIKKU_PRUNE_BATCH_SIZE"),
    )
    prune.add_argument(
        "--dry-run",
        action="store_true",
        default=env_flag("PIKKU_PRUNE_DRY_RUN"),
        help=env_help("count what would go, delete nothing", "PIKKU_PRUNE_DRY_RUN"),
    )
    prune.set_defaults(func=cmd_prune)
