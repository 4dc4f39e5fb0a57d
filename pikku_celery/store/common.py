"""Small values and checks every store operation shares: times, ids, pages, UNSET."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pikku_celery.errors import InvalidStatus
from pikku_celery.schema import format_timestamp
from pikku_celery.store.models import RUN_STATUSES

__all__ = [
    "MAX_PAGE",
    "UNSET",
    "ErrorLike",
    "Unset",
    "check_page",
    "like_prefix",
    "new_id",
    "now",
    "run_day",
    "run_statuses",
    "sqlite_value",
]

ErrorLike = BaseException | Mapping[str, Any] | str


class Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset()


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def sqlite_value(value: Any) -> Any:
    """A parameter as the SQLite column types store it: a time as ISO-8601 UTC text,
    the format ``UtcDateTime`` writes, so compiled statements compare like with like."""
    if isinstance(value, dt.datetime):
        return format_timestamp(value)
    return value


MAX_PAGE: Final = 1000


def check_page(limit: int, offset: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}; page with offset=.")
    if offset < 0:
        raise ValueError("offset must be 0 or more.")


def run_statuses(status: str | Sequence[str] | None) -> list[str]:
    """One status or several, each checked against the run statuses."""
    statuses = [status] if isinstance(status, str) else list(status or [])
    for one in statuses:
        if one not in RUN_STATUSES:
            raise InvalidStatus("run", one, RUN_STATUSES)
    return statuses


def like_prefix(text: str, suffix: str = "%") -> str:
    """A LIKE pattern (escape character ``\\``) matching ``text`` literally, then ``suffix``."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{escaped}{suffix}"


def run_day(made_at: dt.datetime) -> dt.date:
    """The day a run made at ``made_at`` is filed under: its UTC date, on every writer."""
    return made_at.astimezone(dt.timezone.utc).date()


def new_id() -> str:
    return str(uuid.uuid4())
