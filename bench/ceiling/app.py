"""The app the ceiling bench's worker and caller load: one workload's tasks, from the environment.

``celery -A bench.ceiling.app worker`` builds the app of the workload named by
``BENCH_CEILING_WORKLOAD`` at import, and so does the caller process, so both
sides carry the same settings. Every task is a mirrored step; the workloads
with results use ``backend="pikku://"`` with ``task_track_started`` and
``result_extended``, the others have Celery's result backend off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final

from celery import Celery

from bench.harness.broker import DEFAULT_REDIS_URL
from bench.harness.workers import BROKER_ENV, DATABASE_ENV
from pikku_celery import PikkuCelery

__all__ = ["BY_KEY", "CHORD_SIZE", "WORKLOADS", "WORKLOAD_ENV", "Workload", "app", "build_app"]

WORKLOAD_ENV: Final = "BENCH_CEILING_WORKLOAD"

NOOP: Final = "ceiling.noop"
RETRY: Final = "ceiling.retry"
PART: Final = "ceiling.part"
TOTAL: Final = "ceiling.total"
#: Header tasks per chord; its body is one more task.
CHORD_SIZE: Final = 20


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    #: Celery's result backend is ``pikku://`` (else off).
    results: bool
    #: Tasks (steps) per unit the caller sends: a lone task, or a chord's header and body.
    tasks_per_unit: int = 1
    #: Attempts per task.
    attempts: int = 1

    @property
    def unit(self) -> str:
        return "chord" if self.tasks_per_unit > 1 else "task"


WORKLOADS: Final = (
    Workload("lone", "(a) lone no-op, mirror only", results=False),
    Workload("retry", "(b) retry once, mirror only", results=False, attempts=2),
    Workload("results", "(c) lone no-op, pikku:// + get()", results=True),
    Workload("chord", f"(d) chord of {CHORD_SIZE}, pikku://", True, CHORD_SIZE + 1),
)
BY_KEY: Final = {workload.key: workload for workload in WORKLOADS}


def build_app(key: str, broker_url: str, database_url: str | None) -> Celery:
    """The workload's app with the four tasks every workload shares."""
    if key not in BY_KEY:
        raise SystemExit(f"unknown workload {key!r}; one of {', '.join(BY_KEY)}")
    if not database_url:
        raise SystemExit(f"the ceiling bench's app needs ${DATABASE_ENV}")
    workload = BY_KEY[key]
    app = Celery(
        f"ceiling_{key}", broker=broker_url, backend="pikku://" if workload.results else None
    )
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    if workload.results:
        app.conf.update(task_track_started=True, result_extended=True)
    pikku = PikkuCelery(app, database_url=database_url)

    @pikku.step(name=NOOP, shared=False)
    def noop(run: str) -> None:
        return None

    @pikku.step(name=RETRY, bind=True, shared=False)
    def retry_once(self: Any, run: str) -> None:
        if self.request.retries == 0:
            raise self.retry(countdown=0)

    @pikku.step(name=PART, shared=False)
    def part(run: str) -> int:
        return 1

    @pikku.step(name=TOTAL, shared=False)
    def total(values: list[int], run: str) -> int:
        return sum(values)

    return app


def _app_from_env() -> Celery | None:
    key = os.environ.get(WORKLOAD_ENV)
    if not key:
        return None
    return build_app(
        key, os.environ.get(BROKER_ENV) or DEFAULT_REDIS_URL, os.environ.get(DATABASE_ENV)
    )


#: What ``celery -A bench.ceiling.app`` loads (None when no workload is set).
app = _app_from_env()
