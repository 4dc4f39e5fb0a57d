"""The order in which the sides of a comparison take their turns.

On a shared machine a slow spell (another job, a checkpoint, a cold cache)
lands on whoever runs during it; changing the order from turn to turn spreads
it over every side alike instead of passing it off as a difference between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["alternated", "rotated"]

T = TypeVar("T")


def rotated(sides: Sequence[T], turn: int) -> list[T]:
    """``sides`` shifted by ``turn``: each side takes each place, none always follows another."""
    shift = turn % len(sides)
    return [*sides[shift:], *sides[:shift]]


def alternated(sides: Sequence[T], turn: int) -> list[T]:
    """``sides`` in order on even turns and reversed on odd ones."""
    return list(sides) if turn % 2 == 0 else list(sides[::-1])
