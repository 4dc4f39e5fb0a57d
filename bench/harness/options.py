"""The command line every benchmark shares: its servers, rounds, quick mode and lists.

Each bench adds its own options to the parser these make, so ``--pg-url``,
``--redis-url``, ``--rounds``, ``--quick`` and ``--check`` read and default
the same way in every one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Sequence

from bench.harness.postgres import DEFAULT_PG_URL, PG_URL_ENV

__all__ = ["BenchParser", "comma_list", "parser"]


class BenchParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose counts have a full and a ``--quick`` default."""

    def __init__(self, prog: str, description: str) -> None:
        super().__init__(prog=prog, description=description)
        self._sizes: dict[str, tuple[int, int]] = {}

    def size(self, option: str, full: int, quick: int, what: str) -> None:
        """``option``, a count of at least 1: ``full`` unless given, ``quick`` with --quick."""
        self.add_argument(option, type=int, help=f"{what} (default {full:,}, --quick {quick:,})")
        self._sizes[option.removeprefix("--").replace("-", "_")] = (full, quick)

    def read(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """The parsed options, each count given or defaulted (refused below 1)."""
        args = self.parse_args(argv)
        for name, (full, quick) in self._sizes.items():
            if getattr(args, name) is None:
                setattr(args, name, quick if args.quick else full)
            if getattr(args, name) < 1:
                self.error(f"--{name.replace('_', '-')} must be at least 1")
        return args


def parser(
    bench: str,
    description: str,
    *,
    quick: str,
    databases: Sequence[str] = (),
    redis_url: str | None = None,
    rounds: tuple[int, int, str] | None = None,
    check: str | None = None,
) -> BenchParser:
    """The parser of ``python -m bench.<bench>`` with the options it shares.

    ``databases`` are the ones it makes on the PostgreSQL server (none: no
    ``--pg-url``); ``redis_url`` the default of ``--redis-url`` (None: no
    Redis; ``bench.harness.broker.DEFAULT_REDIS_URL`` reads ``$PIKKU_BENCH_REDIS_URL``);
    ``rounds`` the full and quick rounds and what is kept of them; ``check``
    the help of ``--check`` (None: no such option).
    """
    made = BenchParser(f"python -m bench.{bench}", description)
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
        full, quick_rounds, kept = rounds
        made.size("--rounds", full, quick_rounds, f"rounds; {kept}")
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
