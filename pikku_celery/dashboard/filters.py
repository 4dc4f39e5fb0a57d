"""The runs list's query string: filters and paging, checked once for pages and the API."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final
from urllib.parse import urlencode

from starlette.datastructures import QueryParams

from pikku_celery.store import RUN_STATUSES

__all__ = ["MAX_LIMIT", "RunFilters"]

MAX_LIMIT: Final = 1000
DEFAULT_LIMIT: Final = 50


def _int(params: QueryParams, name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {raw!r}.") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, not {value}.")
    return value


@dataclass(frozen=True, slots=True)
class RunFilters:
    statuses: tuple[str, ...] = ()
    workflow: str | None = None
    q: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0

    @classmethod
    def from_query(cls, params: QueryParams) -> RunFilters:
        """Raises ``ValueError`` with a message for the user when a parameter is wrong."""
        statuses = tuple(
            dict.fromkeys(
                part.strip()
                for value in params.getlist("status")
                for part in value.split(",")
                if part.strip()
            )
        )
        for status in statuses:
            if status not in RUN_STATUSES:
                raise ValueError(
                    f"{status!r} is not a run status; use one of {', '.join(sorted(RUN_STATUSES))}."
                )
        return cls(
            statuses=statuses,
            workflow=params.get("workflow", "").strip() or None,
            q=params.get("q", "").strip() or None,
            limit=_int(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
            offset=_int(params, "offset", 0, 0, 2**62),
        )

    @property
    def status(self) -> str:
        """The one status the page's select shows ("" for any)."""
        return self.statuses[0] if len(self.statuses) == 1 else ""

    def query(self, *, offset: int) -> str:
        """The query string of another page of the same list; defaults are left out."""
        moved = replace(self, offset=offset)
        pairs: list[tuple[str, str]] = [("status", s) for s in moved.statuses]
        if moved.workflow:
            pairs.append(("workflow", moved.workflow))
        if moved.q:
            pairs.append(("q", moved.q))
        if moved.limit != DEFAULT_LIMIT:
            pairs.append(("limit", str(moved.limit)))
        if moved.offset:
            pairs.append(("offset", str(moved.offset)))
        return "?" + urlencode(pairs) if pairs else ""
