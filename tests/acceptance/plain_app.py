"""An existing Celery app, as a team has it before pikku-celery: plain tasks only.

Not one task is decorated for pikku-celery; the one line at the bottom of
the configuration mirrors them all. Configured from the environment:
``PLAIN_BROKER_URL``, ``PLAIN_BACKEND_URL``, ``PLAIN_DATABASE_URL`` and
``PLAIN_QUEUE``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, chain, group, shared_task

from pikku_celery import PikkuCelery

app = Celery(
    "plain",
    broker=os.environ.get("PLAIN_BROKER_URL", "redis://127.0.0.1:6379/13"),
    backend=os.environ.get("PLAIN_BACKEND_URL") or None,
)
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("PLAIN_QUEUE", "celery"),
    pikku_flush_interval=0.04,
)

pikku = PikkuCelery(
    app,
    database_url=os.environ.get("PLAIN_DATABASE_URL"),
    mirror="all",
    exclude=["plain.noisy_*"],
)


@app.task(name="plain.add")
def add(x: int, y: int = 0) -> int:
    return x + y


@app.task(name="plain.double")
def double(x: int) -> int:
    return x * 2


@app.task(name="plain.total")
def total(values: list[int]) -> int:
    return sum(values)


@app.task(bind=True, name="plain.flaky", max_retries=5)
def flaky(self: Any, fails: int) -> str:
    if self.request.retries < fails:
        raise self.retry(exc=ConnectionError("the gateway is busy"), countdown=0)
    return f"done after {self.request.retries} retries"


@app.task(bind=True, name="plain.bare_retry", max_retries=5)
def bare_retry(self: Any, fails: int) -> int:
    if self.request.retries < fails:
        raise self.retry(countdown=0)  # no exc: Celery's Retry itself is the reason
    return int(self.request.retries)


@app.task(name="plain.refund", autoretry_for=(ValueError,), max_retries=2, default_retry_delay=0)
def refund(order_id: int) -> None:
    raise ValueError(f"order {order_id} cannot be refunded")


@app.task(name="plain.noisy_ping")
def noisy_ping() -> str:
    return "pong"


# As a reusable app or a third-party package declares its tasks: for whichever app loads it.
@shared_task(name="plain.shared_greet")
def greet(name: str) -> str:
    return f"hello {name}"


def _ran(key: str) -> None:
    """Counts a body's executions where the test can read them (the result backend's Redis)."""
    import redis

    redis.Redis.from_url(app.conf.result_backend).incr(key)


# Celery's Task.replace in its three shapes: the replacement takes over the task's id.
@app.task(bind=True, name="plain.add_to_all")
def add_to_all(self: Any, nums: list[int], val: int, key: str) -> None:
    _ran(key)
    raise self.replace(group(add.s(n, val) for n in nums))


@app.task(bind=True, name="plain.replace_with_one")
def replace_with_one(self: Any, x: int, key: str) -> None:
    _ran(key)
    raise self.replace(add.s(x, 1))


@app.task(bind=True, name="plain.replace_with_chain")
def replace_with_chain(self: Any, x: int, key: str) -> None:
    _ran(key)
    raise self.replace(chain(add.s(x, 1), double.s()))


@app.task(bind=True, name="plain.ignored")
def ignored(self: Any, key: str) -> None:
    from celery.exceptions import Ignore

    _ran(key)
    raise Ignore()
