"""The app of the Citus drive: ``backend="pikku://"`` on the database named in the environment.

Its workers and the driver build the same app from ``BENCH_BROKER_URL`` and
``BENCH_DATABASE_URL``; ``BENCH_JOURNAL_DIR`` gives each worker a journal folder
of its own, so each is a node with a flusher of its own, as on separate hosts.
"""

from __future__ import annotations

import os
from typing import Any, Final

from celery import Celery

from bench.harness.workers import BROKER_ENV, DATABASE_ENV
from pikku_celery import PikkuCelery

__all__ = ["ADD", "FLAKY", "NOOP", "TOTAL", "build_app"]

NOOP: Final = "citus.noop"
ADD: Final = "citus.add"
FLAKY: Final = "citus.flaky"
TOTAL: Final = "citus.total"
JOURNAL_ENV: Final = "BENCH_JOURNAL_DIR"


def build_app(broker_url: str, database_url: str, journal_dir: str | None = None) -> Celery:
    app = Celery("citus_drive", broker=broker_url, backend="pikku://")
    app.conf.update(
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_track_started=True,
        result_extended=True,
    )
    pikku = PikkuCelery(app, database_url=database_url, journal_dir=journal_dir)

    @pikku.step(name=NOOP, shared=False)
    def noop() -> None:
        return None

    @pikku.step(name=ADD, shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    # Fails its first attempt: a retry, a second attempt row, the step's run held open.
    @pikku.step(name=FLAKY, shared=False, bind=True, max_retries=2)
    def flaky(self: Any, x: int) -> int:
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return x

    @pikku.step(name=TOTAL, shared=False)
    def total(values: list[int]) -> int:
        return sum(values)

    return app


def _app_from_env() -> Celery | None:
    broker, database = os.environ.get(BROKER_ENV), os.environ.get(DATABASE_ENV)
    if not broker or not database:
        return None
    return build_app(broker, database, os.environ.get(JOURNAL_ENV) or None)


#: What ``celery -A bench.citus.app worker`` loads.
app = _app_from_env()
