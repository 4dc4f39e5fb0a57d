"""The app the docker tests' worker containers run, as a user writes one.

Copied into the containers as it is, so it imports only what the image holds. Steps count
what they really did in ``docker_effects`` (the mirror's own database), so a test can hold
the mirror against reality; ``gate`` waits for a row the test writes in ``docker_gates``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from celery import Celery

from pikku_celery import PikkuCelery

app = Celery("dockerapp")
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    # The workers' reaper looks for steps of dead workers every second, not every 10.
    pikku_reaper_interval=1.0,
    # The test process's journal (the containers journal where the image says).
    pikku_journal_dir=os.environ.get("DOCKERAPP_JOURNAL_DIR") or None,
)
pikku = PikkuCelery(app)


def _database() -> psycopg.Connection[Any]:
    return psycopg.connect(os.environ["PIKKU_DATABASE_URL"], autocommit=True)


def setup_tables() -> None:
    with _database() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS docker_effects (label TEXT, host TEXT)")
        conn.execute("CREATE TABLE IF NOT EXISTS docker_gates (label TEXT)")


def effect(label: str) -> None:
    with _database() as conn:
        conn.execute(
            "INSERT INTO docker_effects VALUES (%s, %s)", (label, os.environ.get("HOSTNAME"))
        )


@pikku.step(name="docker.reserve")
def reserve(order_id: int) -> dict[str, Any]:
    effect(f"reserve-{order_id}")
    return {"order": order_id}


@pikku.step(name="docker.charge", bind=True, retries=3, retry_delay=0)
def charge(self: Any, order: dict[str, Any], fail_times: int) -> dict[str, Any]:
    effect(f"charge-{order['order']}")
    if self.request.retries < fail_times:
        raise ConnectionError(f"gateway timeout (attempt {self.request.retries + 1})")
    return {**order, "charged": True}


@pikku.step(name="docker.refund", retries=1, retry_delay=0)
def refund(order: dict[str, Any]) -> None:
    effect(f"refund-{order['order']}")
    raise ValueError(f"order {order['order']} cannot be refunded")


@pikku.step(name="docker.count")
def count(label: str) -> int:
    effect(label)
    return len(label)


def _gate(label: str, timeout: float) -> int:
    effect(f"{label}-start")
    deadline = time.monotonic() + timeout
    with _database() as conn:
        while not conn.execute("SELECT 1 FROM docker_gates WHERE label = %s", (label,)).fetchone():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {label} was never opened")
            time.sleep(0.2)
    effect(label)
    return len(label)


# Runs until the test opens the gate named ``label``: a step that is surely mid-way.
# Acknowledged when it ends: a killed worker's message is given out again.
@pikku.step(name="docker.gate", acks_late=True)
def gate(label: str, timeout: float = 60) -> int:
    return _gate(label, timeout)


# Acknowledged on receipt: a broker that restarts mid-step does not hand it out twice.
@pikku.step(name="docker.gate_acked", acks_late=False)
def gate_acked(label: str, timeout: float = 60) -> int:
    return _gate(label, timeout)


@pikku.workflow("docker-durable")
def durable(ctx: Any, tag: str, acked_early: bool = False) -> list[int]:
    return [
        ctx.do("first", count, f"{tag}-first"),
        ctx.do("middle", gate_acked if acked_early else gate, f"{tag}-middle"),
        ctx.do("last", count, f"{tag}-last"),
    ]


@pikku.step(name="docker.add")
def add(x: int, y: int) -> int:
    return x + y


@pikku.step(name="docker.slow_add")
def slow_add(x: int, y: int) -> int:
    time.sleep(0.3)
    return x + y


@pikku.workflow("docker-many")
def many(ctx: Any, tag: str, steps: int) -> int:
    return sum(ctx.do(f"step-{n}", count, f"{tag}-{n}") for n in range(steps))
