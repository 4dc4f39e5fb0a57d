"""The command line every benchmark shares: its servers, rounds, quick mode and lists.

Each bench adds its own options to the parser these make, so ``--pg-url``,
``--redis-url``, ``--rounds``, ``--quick`` and ``--check`` read and default
the same way in every one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Sequence

from bench.harness.postgres import DEFAULT_PG_URL, PG_URL_ENV

__all__ = ["at_least_one", "comma_list", "parser"]


def parser(
    bench: str,
    description: str,
    *,
    quick: str,
    databases: Sequence[str] = (),
    redis_url: str | None = None,
    rounds: str | None = None,
    check: str | None = "exit 1 when a target is missed, too",
) -> argparse.ArgumentParser:
    """The parser of ``python -m bench.<bench>`` with the options it shares.

    ``databases`` are the ones it makes on the PostgreSQL server (none: no
    ``--pg-url``); ``redis_url`` the default of ``--redis-url`` (None: no
    Redis; ``bench.harness.broker.DEFAULT_REDIS_URL`` reads ``$PIKKU_BENCH_REDIS_URL``);
    ``rounds`` and ``check`` the help of those options (None: not taken).
    """
    made = argparse.ArgumentParser(prog=f"python -m bench.{bench}", description=description)
    if databases:
        made.add_argument(
            "--pg-url",
            default=DEFAULT_PG_URL,
            help=f"an existing PostgreSQL database to connect to (default ${PG_URL_ENV}, "
            f"else {DEFAULT_PG_URL}); the bench creates and drops "
            f"{', '.join(databases)} on its server",
        )
    if redis_url is not None:
        made.add_argument(
            "--redis-url",
            default=redis_url,
            help=f"the broker and Redis result backend (default {redis_url}); "
            "this database is flushed",
        )
    if rounds is not None:
        made.add_argument("--rounds", type=int, help=rounds)
    made.add_argument("--quick", action="store_true", help=quick)
    if check is not None:
        made.add_argument("--check", action="store_true", help=check)
    return made


def comma_list(choices: Collection[str]) -> Callable[[str], tuple[str, ...]]:
    """An option's value read as a comma-separated list of some of ``choices``."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
        if not names or any(name not in choices for name in names):
            raise argparse.ArgumentTypeError(f"some of {','.join(choices)}")
        return names

    return parse


def at_least_one(**counts: int) -> None:
    """Refuse a count below 1, naming its option (``--tasks`` for ``tasks=``)."""
    low = [f"--{name.replace('_', '-')}" for name, value in counts.items() if value < 1]
    if low:
        raise SystemExit(f"{' and '.join(low)} must be at least 1")
