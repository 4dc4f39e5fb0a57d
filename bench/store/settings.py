"""The store bench's numbers: rounds, batch sizes and row counts, from the command line."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    rounds: int
    small_rows: int
    big_rows: int
    probe_steps: int
    profile: bool
    batch_size: int
    batch_tasks: int


def settings_from(args: argparse.Namespace) -> Settings:
    quick = bool(args.quick)
    settings = Settings(
        rounds=args.rounds,
        small_rows=1000,
        big_rows=args.big_rows,
        probe_steps=100 if quick else 300,
        profile=bool(args.profile),
        batch_size=args.batch_size or 100,
        batch_tasks=args.tasks,
    )
    if settings.batch_size < 2 or settings.batch_tasks < settings.batch_size:
        raise SystemExit("--batch-size must be at least 2 and --tasks at least --batch-size")
    if settings.big_rows < 10 * settings.small_rows:
        raise SystemExit(f"--big-rows must be at least {10 * settings.small_rows:,}")
    return settings
