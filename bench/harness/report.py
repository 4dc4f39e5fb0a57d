"""Printing progress and result tables."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["best", "fmt", "ratio", "say", "table", "verdict"]

R = TypeVar("R")


def say(text: str = "") -> None:
    # Flushed: the benches run for minutes, often piped into a file or tee.
    print(text, flush=True)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A plain-text table: the first column left-aligned, the figures right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * width for width in widths], *rows]:
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
        ]
        say("  ".join(cells).rstrip())


def fmt(value: float | None, spec: str = ".2f", scale: float = 1.0) -> str:
    """A figure, or ``n/a`` where the run could not measure it (NaN included)."""
    if value is None or value != value:
        return "n/a"
    return format(value * scale, spec)


def verdict(value: float | None, target: float, *, at_most: bool = False) -> str:
    if value is None:
        return "n/a"
    return "met" if (value <= target if at_most else value >= target) else "MISSED"


def best(runs: Sequence[R], keep: Callable[[R], bool], key: Callable[[R], float]) -> R | None:
    """The run of ``runs`` that ``keep`` takes with the highest ``key``; None if none."""
    matching = [run for run in runs if keep(run)]
    return max(matching, key=key) if matching else None


def ratio(top: R | None, bottom: R | None, measure: Callable[[R], float]) -> float | None:
    """``measure`` of ``top`` over that of ``bottom``; None where either is missing or 0."""
    if top is None or bottom is None or not measure(bottom):
        return None
    return measure(top) / measure(bottom)
