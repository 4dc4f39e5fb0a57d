"""Clocks and the statistics the benches report."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

__all__ = ["p90", "quantile", "timed"]


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` took."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile by rank (no interpolation: a lag that happened), None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def p90(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[8]
