"""Retry delays as the tables hold them: Pikku's duration strings, a whole number and a unit.

Pikku's parser takes no decimals and reads a plain number as milliseconds,
while Celery counts seconds; a bare number in the table would mean one thing
to one side and another to the other. So a delay is always written with its
unit: whole seconds as ``"180s"``, anything finer as ``"200ms"``.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Final

from pikku_celery.errors import InvalidDuration

__all__ = ["format_duration", "parse_duration"]

_MS_PER_UNIT: Final = {
    **dict.fromkeys(("ms", "msec", "msecs", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1000),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
    **dict.fromkeys(("w", "week", "weeks"), 604_800_000),
}
_WITH_UNIT: Final = re.compile(r"\s*(\d+)\s*([A-Za-z]+)\s*")
# What pikku-celery wrote before revision 0005: seconds as Python printed them.
_BARE_SECONDS: Final = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*")


def _text(milliseconds: int) -> str:
    if milliseconds % 1000 == 0:
        return f"{milliseconds // 1000}s"
    return f"{milliseconds}ms"


def _milliseconds(text: str) -> int | None:
    with_unit = _WITH_UNIT.fullmatch(text)
    if with_unit is not None:
        factor = _MS_PER_UNIT.get(with_unit.group(2).lower())
        return None if factor is None else int(with_unit.group(1)) * factor
    bare = _BARE_SECONDS.fullmatch(text)
    if bare is not None:
        return round(float(bare.group(1)) * 1000)
    return None


def format_duration(value: float | str | dt.timedelta) -> str:
    """The stored text of a retry delay: seconds (a number, as Celery counts them), a
    timedelta, or a duration string (``"5s"``, ``"2min"``). Kept to the millisecond."""
    if isinstance(value, bool):
        raise InvalidDuration(value)
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise InvalidDuration(value)
        return _text(round(value * 1000))
    if isinstance(value, str):
        milliseconds = _milliseconds(value)
        if milliseconds is None:
            raise InvalidDuration(value)
        return _text(milliseconds)
    raise InvalidDuration(value)


def parse_duration(text: str) -> dt.timedelta:
    """A stored retry delay as a timedelta: ``"5s"``, ``"200ms"``, ``"2min"``, or the bare
    seconds pikku-celery wrote before revision 0005 (``"180"``, ``"0.2"``)."""
    milliseconds = _milliseconds(text) if isinstance(text, str) else None
    if milliseconds is None:
        raise InvalidDuration(text)
    return dt.timedelta(milliseconds=milliseconds)
