"""Printing progress and result tables."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["fmt", "say", "table", "verdict"]


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
