"""What an event carries, encoded once when it is made: JSON values and routings.

A value that is not JSON is stored as a marked placeholder, never dropped and
never failing the user's task; a message's routing is kept as far as it can
be sent there again, encoded once per queue.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pikku_celery.store import NewRun

__all__ = ["PublishedStep", "routing_json", "unserialisable"]


def unserialisable(value: Any) -> dict[str, Any]:
    """The marked placeholder stored for a value that is not JSON."""
    text = repr(value)
    return {
        "__pikku_unserialisable__": True,
        "type": f"{type(value).__module__}.{type(value).__qualname__}",
        "repr": text if len(text) <= 2000 else text[:1999] + "…",
    }


@dataclass(frozen=True, slots=True)
class PublishedStep:
    """What the publishing side knows of a step when its message is sent.

    ``parent_step_id``: the step it follows, by id (its name, ``add#2`` say,
    is only known once that step is in SQL).
    """

    run_id: str
    step_id: str
    step_name: str
    rpc_name: str
    data: Any
    parent_step_id: str | None = None
    retries: int | None = None
    retry_delay: float | None = None
    eta: dt.datetime | None = None
    new_run: NewRun | None = None
    routing: Mapping[str, Any] | None = None
    #: A chord's header task: the task id of the chord's body, which holds the run open.
    chord_body: str | None = None
    #: When the message was sent (default: when the event is made).
    at: float | None = None


# A process sends to a few queues: each one's routing is encoded once, not per event.
_ROUTINGS: dict[tuple[Any, Any], str | None] = {}
_ROUTINGS_KEPT: Final = 256


def routing_json(routing: Mapping[str, Any] | None) -> str | None:
    """Where a message went, kept only as far as it can be sent there again."""
    if not routing:
        return None
    key = (routing.get("exchange"), routing.get("routing_key"))
    try:
        return _ROUTINGS[key]
    except (KeyError, TypeError):  # TypeError: a value that is no dict key
        pass
    kept = {
        name: str(value)
        for name, value in zip(("exchange", "routing_key"), key, strict=True)
        if value is not None
    }
    encoded = json.dumps(kept, separators=(",", ":")) if kept else None
    if len(_ROUTINGS) >= _ROUTINGS_KEPT:
        _ROUTINGS.clear()
    with contextlib.suppress(TypeError):
        _ROUTINGS[key] = encoded
    return encoded
