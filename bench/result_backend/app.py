"""The Celery app of the result backend bench: one backend's tasks, built from the environment.

``celery -A bench.result_backend.app worker`` builds the app of the backend named by
``BENCH_RESULT_BACKEND`` at import, and so does the client process, so both
sides carry the same settings: ``task_track_started`` and ``result_extended``
on every backend, nothing else changed from Celery's or pikku's defaults.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from celery import Celery

from bench.harness.broker import DEFAULT_REDIS_URL
from bench.harness.workers import BROKER_ENV, DATABASE_ENV
from pikku_celery import PikkuCelery

BACKEND_ENV: Final = "BENCH_RESULT_BACKEND"

NOOP: Final = "rbench.noop"
ADD: Final = "rbench.add"
TOTAL: Final = "rbench.total"


@dataclass(frozen=True)
class Backend:
    key: str
    label: str
    #: The bench database this backend keeps its results in; None for Redis.
    database: str | None


BACKENDS: Final = (
    Backend("redis", "Redis", None),
    Backend("db", "db+ (SQLAlchemy)", "pikku_rbench_sqla"),
    Backend("pikku", "pikku://", "pikku_rbench_pikku"),
    Backend("dcr", "django-celery-results", "pikku_rbench_dcr"),
)
BY_KEY: Final = {backend.key: backend for backend in BACKENDS}
DATABASES: Final = tuple(b.database for b in BACKENDS if b.database is not None)


def _backend_url(key: str, broker_url: str, database_url: str | None) -> str:
    if key == "redis":
        return broker_url
    if database_url is None:
        raise SystemExit(f"the {key!r} backend needs ${DATABASE_ENV}")
    if key == "db":
        return f"db+{database_url}"
    if key == "pikku":
        return "pikku://"
    from bench.result_backend.dcr import configure_django

    configure_django(database_url)
    return "django-db"


def build_app(key: str, broker_url: str, database_url: str | None) -> tuple[Celery, Any]:
    """The backend's app with its three tasks; its PikkuCelery for ``pikku`` (else None)."""
    if key not in BY_KEY:
        raise SystemExit(f"unknown backend {key!r}; one of {', '.join(BY_KEY)}")
    app = Celery(
        f"rbench_{key}", broker=broker_url, backend=_backend_url(key, broker_url, database_url)
    )
    app.conf.update(
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_track_started=True,
        result_extended=True,
    )
    pikku = PikkuCelery(app, database_url=database_url) if key == "pikku" else None
    # Mirrored steps on pikku, as its result backend is meant to be used; plain tasks elsewhere.
    task: Callable[..., Callable[[Callable[..., Any]], Any]] = (
        pikku.step if pikku is not None else app.task
    )

    @task(name=NOOP, shared=False)
    def noop() -> None:
        return None

    @task(name=ADD, shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @task(name=TOTAL, shared=False)
    def total(values: list[int]) -> int:
        return sum(values)

    return app, pikku


def _app_from_env() -> Celery | None:
    key = os.environ.get(BACKEND_ENV)
    if not key:
        return None
    app, _ = build_app(
        key, os.environ.get(BROKER_ENV) or DEFAULT_REDIS_URL, os.environ.get(DATABASE_ENV)
    )
    return app


#: What ``celery -A bench.result_backend.app`` loads (None when no backend is set).
app = _app_from_env()
