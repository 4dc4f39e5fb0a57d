"""``create_app``: the dashboard as a Starlette app around one ``WorkflowStore``.

Nothing happens at import: the store, the run actions and the settings are
passed in, and every request reads through the store.
"""

from __future__ import annotations

import math
import os
from typing import Final
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pikku_celery.dashboard.actions import RunActions
from pikku_celery.dashboard.auth import DashboardAuth
from pikku_celery.dashboard.context import Dashboard, make_templates
from pikku_celery.dashboard.routes import Views
from pikku_celery.errors import ConfigurationError, StoreError
from pikku_celery.store import WorkflowStore

__all__ = ["create_app"]

STALE_AFTER_ENV: Final = "PIKKU_STALE_AFTER"
DEFAULT_STALE_AFTER: Final = 600.0
# Past a year the threshold means "never"; bounding it keeps the time arithmetic finite.
_MAX_STALE_AFTER: Final = 366 * 86400.0

# No script runs on these pages, so none may; nor may another site frame them
# to trick a click on an action button.
_SECURITY_HEADERS: Final = [
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


class _SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _flower(url: str | None) -> str | None:
    if not url:
        return None
    parts = urlsplit(url)
    # The URL goes into every attempt's link: a javascript: URL would run there.
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(
            f"The Flower URL must be an http(s) address like http://localhost:5555, not {url!r}."
        )
    return url.rstrip("/")


def _stale_after(value: float | None) -> float:
    if value is not None:
        source, given = "stale_after", repr(value)
    else:
        raw = os.environ.get(STALE_AFTER_ENV, "").strip()
        if not raw:
            return DEFAULT_STALE_AFTER
        source, given = STALE_AFTER_ENV, repr(raw)
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
    if not 0 < value <= _MAX_STALE_AFTER:
        raise ConfigurationError(
            f"{source} is how many seconds a scheduled step may wait for a worker before it "
            f"is reported, like 600; it must be above 0 and at most a year, not {given}."
        )
    return value


def create_app(
    store: WorkflowStore,
    *,
    actions: RunActions | None = None,
    flower_url: str | None = None,
    auth_token: str | None = None,
    stale_after: float | None = None,
) -> Starlette:
    """The dashboard for ``store``.

    ``auth_token`` is the password (HTTP Basic, any user name). With it,
    every page, every ``/api/`` document and every action needs it; only
    ``/healthz`` (liveness), ``/readyz`` (readiness: 503 while the schema is missing
    or behind) and ``/metrics`` (counts, no run data) stay open. Without it
    the dashboard is read-only and anyone who reaches it can read every run.

    ``actions`` adds resume, rerun and cancel buttons and the "Send event" form
    (delete uses the store).
    ``flower_url`` links every attempt to Flower's page of its Celery task.
    ``stale_after`` is how many seconds a scheduled step may wait for a worker
    before the runs page and ``/metrics`` report it (default: the
    ``PIKKU_STALE_AFTER`` environment variable, else 600).
    """
    dashboard = Dashboard(
        store=store,
        actions=actions,
        flower_url=_flower(flower_url),
        auth=DashboardAuth(auth_token),
        templates=make_templates(),
        stale_after=_stale_after(stale_after),
    )
    views = Views(dashboard)
    return Starlette(
        routes=views.routes(),
        middleware=[Middleware(_SecurityHeaders)],
        exception_handlers={StoreError: views.store_failed},
    )
