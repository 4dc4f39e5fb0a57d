"""The worker pools the Celery bench runs on, and which scenarios each runs."""

from __future__ import annotations

from typing import Final

POOLS: Final = {
    "prefork": ("--pool=prefork", "-c", "2"),
    "threads": ("--pool=threads", "-c", "4"),
    "solo": ("--pool=solo",),
}
POOL_LABELS: Final = {"prefork": "prefork -c 2", "threads": "threads -c 4", "solo": "solo"}
# The scenarios the threads and solo pools run, no-op tasks only.
POOL_SCENARIOS: Final = ("plain", "dbbackend", "pikku")
