"""What every handler of one dashboard app shares: the store, settings and page rendering."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from pikku_celery.dashboard.actions import RunActions
from pikku_celery.dashboard.auth import CSRF_FIELD, DashboardAuth
from pikku_celery.store import LOST_ERROR_TYPE, WorkflowStore

__all__ = ["Dashboard", "make_templates"]


def _when(value: dt.datetime | None) -> str:
    return "—" if value is None else value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _took(value: dt.timedelta | None) -> str:
    return "" if value is None else f"{value.total_seconds():.3f}s"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _age(seconds: float) -> str:
    """A threshold in the unit people set it in: "90 s", "10 min", "2 h", "1.5 h"."""
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _short(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def make_templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pikku_celery.dashboard", "templates"),
        # Every value shown comes from users' tasks: escape all of it.
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(when=_when, took=_took, pretty=_pretty, short=_short, age=_age)
    env.globals["lost_error_type"] = LOST_ERROR_TYPE
    return env


@dataclass(frozen=True, slots=True)
class Dashboard:
    """One dashboard app's store, settings and templates."""

    store: WorkflowStore
    actions: RunActions | None
    flower_url: str | None
    auth: DashboardAuth
    templates: jinja2.Environment
    # A scheduled step nobody has started for this long is reported as stale.
    stale_after: float = 600.0
    refresh_seconds: int = 5

    @staticmethod
    def root(request: Request) -> str:
        """Where the app is mounted, so links work under a prefix too."""
        return str(request.scope.get("root_path", "")).rstrip("/")

    def run_url(self, request: Request, run_id: str, action: str | None = None) -> str:
        # Quoted whole: a run id may hold any character, "/" and "?" included.
        path = f"{self.root(request)}/runs/{quote(run_id, safe='')}"
        return f"{path}/{action}" if action else path

    def render(
        self, request: Request, name: str, *, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        signed_in = self.auth.signed_in(request)
        token, new_nonce = self.auth.form_token(request) if signed_in else (None, None)
        html = self.templates.get_template(name).render(
            root=self.root(request),
            path=request.url.path,
            run_url=lambda run_id, action=None: self.run_url(request, run_id, action),
            auth_enabled=self.auth.enabled,
            signed_in=signed_in,
            actions_enabled=self.actions is not None,
            csrf_field=CSRF_FIELD,
            csrf_token=token,
            refresh=context.pop("refresh", 0),
            **context,
        )
        response = HTMLResponse(html, status_code=status_code)
        if new_nonce is not None:
            self.auth.set_nonce(request, response, new_nonce)
        return response
