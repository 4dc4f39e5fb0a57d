"""The Celery app of the workflow benchmark: one no-op step as a workflow, a chain and plain Celery.

``celery -A bench.workflow.app worker`` builds it from ``BENCH_*``
environment variables at import, and counts its pool children's SQL.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from celery import Celery

from bench.harness.broker import redis_client
from bench.harness.workers import BROKER_ENV, DATABASE_ENV
from bench.workflow.sql_counts import install_worker_counter
from pikku_celery import PikkuCelery, Workflow

COUNT_DIR_ENV: Final = "BENCH_COUNT_DIR"

TASK_NAME: Final = "bench.workflow.inc"
PLAIN_TASK_NAME: Final = "bench.workflow.plain_inc"
PLAIN_LAST_TASK_NAME: Final = "bench.workflow.plain_last"
WORKFLOW_NAME: Final = "seq"
CHAIN_NAME: Final = "chain"


@dataclass(frozen=True)
class BenchApp:
    app: Celery
    pikku: PikkuCelery
    inc: Any
    seq: Workflow
    plain_inc: Any
    plain_last: Any


def build_app(broker_url: str, database_url: str) -> BenchApp:
    app = Celery("workflow_bench", broker=broker_url)
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    pikku = PikkuCelery(app, database_url=database_url)

    @pikku.step(name=TASK_NAME)
    def inc(x: int) -> int:
        return x + 1

    @pikku.workflow(WORKFLOW_NAME)
    def seq(ctx: Any, steps: int) -> int:
        x = 0
        for _ in range(steps):
            x = ctx.do("inc", inc, x)
        return x

    # The floor: the same chain of plain Celery tasks, which pikku does not mirror.
    @app.task(name=PLAIN_TASK_NAME)
    def plain_inc(x: int) -> int:
        return x + 1

    @app.task(name=PLAIN_LAST_TASK_NAME)
    def plain_last(x: int, key: str) -> int:
        # No run row to read the end from: the last link says when it ran.
        redis_client(broker_url).rpush(key, json.dumps([time.time(), x + 1]))
        return x + 1

    return BenchApp(app, pikku, inc, seq, plain_inc, plain_last)


def _app_from_env() -> Celery | None:
    broker_url = os.environ.get(BROKER_ENV)
    database_url = os.environ.get(DATABASE_ENV)
    if not broker_url or not database_url:
        return None
    count_dir = os.environ.get(COUNT_DIR_ENV)
    if count_dir:
        install_worker_counter(Path(count_dir))
    return build_app(broker_url, database_url).app


#: What ``celery -A bench.workflow.app`` loads (None outside the worker).
app = _app_from_env()
