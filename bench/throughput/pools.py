"""The worker pools the Celery bench runs on, and which scenarios each runs."""

from __future__ import annotations

import argparse
from typing import Final

POOLS: Final = {
    "prefork": ("--pool=prefork", "-c", "2"),
    "threads": ("--pool=threads", "-c", "4"),
    "solo": ("--pool=solo",),
}
POOL_LABELS: Final = {"prefork": "prefork -c 2", "threads": "threads -c 4", "solo": "solo"}
# The scenarios the threads and solo pools run, no-op tasks only.
POOL_SCENARIOS: Final = ("plain", "dbbackend", "pikku")


def parse_pools(text: str) -> tuple[str, ...]:
    pools = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in pools if name not in POOLS]
    if unknown or not pools:
        raise argparse.ArgumentTypeError(f"pools are some of {', '.join(POOLS)}")
    return pools
