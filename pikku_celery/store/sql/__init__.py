"""The statements the store sends, one module per operation of the store (``attempts``
for ``store/attempts.py``, ``reap`` for ``store/reap.py``, ...), imported by name."""

from __future__ import annotations

from pikku_celery.store.sql import (
    attempts,
    batches,
    claims,
    leases,
    prune,
    reap,
    replica,
    results,
    runs,
    stats,
    versions,
    workflows,
)

__all__ = [
    "attempts",
    "batches",
    "claims",
    "leases",
    "prune",
    "reap",
    "replica",
    "results",
    "runs",
    "stats",
    "versions",
    "workflows",
]
