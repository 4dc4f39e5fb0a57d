"""The web dashboard: runs, steps, attempts and a timeline, a JSON API and Prometheus metrics.

Needs the ``dashboard`` extra (Starlette, Jinja2, uvicorn). Build the app with
:func:`create_app` and serve it with any ASGI server, or run
``pikku-celery dashboard``.
"""

from __future__ import annotations

try:
    import jinja2 as _jinja2  # noqa: F401
    import starlette as _starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        f"The pikku-celery dashboard needs {exc.name}. Run `pip install pikku-celery[dashboard]`."
    ) from exc

from pikku_celery.dashboard.actions import RunActions
from pikku_celery.dashboard.app import create_app

__all__ = ["RunActions", "create_app"]
