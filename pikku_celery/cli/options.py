"""Option values of the ``pikku-celery`` command: ages, bounded numbers, and settings read
from the environment (every option has a variable, shown in ``--help``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
from collections.abc import Callable
from typing import Any, Final

__all__ = ["env_flag", "int_between", "json_value", "listed", "parse_age", "port_number"]

_AGE: Final = re.compile(r"(\d+)\s*([smhd])")
_AGE_UNITS: Final = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_age(text: str) -> dt.timedelta:
    """``30d``, ``12h``, ``90m`` or ``45s`` as a time span."""
    match = _AGE.fullmatch(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age; use a number and a unit: 30d, 12h, 90m or 45s"
        )
    try:
        return dt.timedelta(**{_AGE_UNITS[match.group(2)]: int(match.group(1))})
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} is too long an age") from None


def int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high}")
        return value

    return parse


def port_number(option: str, env: str) -> Callable[[str], int]:
    """A TCP port to listen on; 0 lets the system pick a free one."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if not 0 <= value <= 65535:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a port; give {option} (or {env}) a number from 1 to 65535, "
                "or 0 for any free port"
            )
        return value

    return parse


def json_value(text: str) -> Any:
    """A JSON document given on the command line, like ``runs send --data``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not JSON ({exc.msg} at character {exc.pos}); quote it for the "
            """shell as a whole, like --data '{"approved": true}', and a text in double """
            """quotes inside, like --data '"yes"'"""
        ) from None


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def listed(values: list[str] | None, env: str) -> list[str] | None:
    """``--status a --status b,c``, else the variable's comma-separated list, else None."""
    given = values or ([os.environ[env]] if os.environ.get(env) else [])
    items = [item.strip() for value in given for item in value.split(",") if item.strip()]
    return items or None
