"""``InlineClock``: the inline runner's time, which passes only when the test moves it.

While a runner is open its clock is the time everything that decides *when* reads:
the app's ``app.now()`` (Celery turns a ``countdown`` into an ETA with it, so a
retry's delay is counted on this clock) and the replays' ``context.clock`` (a
wait's deadline, a sleep's wake time). The runner's broker holds every message
whose ETA this clock has not reached. ``context.clock`` is one for the process:
with two runners open at once, replays read the clock of the one opened last.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

from celery import Celery

from pikku_celery.workflows import context

__all__ = ["InlineClock"]

_UNSET: Any = object()


class InlineClock:
    """A clock that stands still until :meth:`move_to` moves it forward (aware, UTC)."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = (start or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)

    def now(self) -> dt.datetime:
        return self._now

    def move_to(self, moment: dt.datetime) -> None:
        """Set the time to ``moment``; a moment already past leaves the clock where it is."""
        self._now = max(self._now, moment.astimezone(dt.timezone.utc))

    @contextlib.contextmanager
    def installed(self, app: Celery) -> Iterator[None]:
        """Make this clock the time of ``app`` and of the replays, until the block ends."""
        timezone = app.timezone

        def app_now() -> dt.datetime:
            # Celery's own app.now() answers in the app's timezone; so does this one.
            return self._now.astimezone(timezone)

        # An attribute of the instance hides Celery's method; whatever was there before
        # (another runner's clock, say) is put back on the way out.
        attributes = vars(app)
        saved_app_now = attributes.get("now", _UNSET)
        saved_clock = context.clock
        attributes["now"] = app_now
        context.clock = self.now
        try:
            yield
        finally:
            context.clock = saved_clock
            if saved_app_now is _UNSET:
                attributes.pop("now", None)
            else:
                attributes["now"] = saved_app_now
