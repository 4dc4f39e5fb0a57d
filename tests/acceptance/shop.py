"""A Celery app as a user writes one, for the acceptance tests' real workers.

Configured from the environment: ``SHOP_BROKER_URL``, ``SHOP_BACKEND_URL`` and
``PIKKU_DATABASE_URL``. Tasks write what they did to ``SHOP_JOURNAL`` (one
line per execution) so tests can compare the mirror with reality.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from celery import Celery, group, signals
from celery.exceptions import Reject, SoftTimeLimitExceeded

from pikku_celery import PikkuCelery, WorkflowTask, current_step
from pikku_celery.errors import EventTimeout, StepFailed

app = Celery(
    "shop",
    broker=os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/15"),
    backend=os.environ.get("SHOP_BACKEND_URL") or None,
)
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_routes={"shop.parked": {"queue": "nobody-consumes-this"}},
    # Unacked messages of a killed worker come back after this long (Redis).
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("SHOP_VISIBILITY_TIMEOUT", "3600")),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)
app.conf.task_default_queue = os.environ.get("SHOP_QUEUE", "celery")
# SHOP_FLUSH_INTERVAL: a test that must catch events in the journal before they are flushed.
app.conf.pikku_flush_interval = float(os.environ.get("SHOP_FLUSH_INTERVAL", "0.04"))
# The workers' own reaper: every 10 s unless a test wants it faster (or off, with 0).
if os.environ.get("SHOP_REAPER_INTERVAL"):
    app.conf.pikku_reaper_interval = float(os.environ["SHOP_REAPER_INTERVAL"])
if os.environ.get("SHOP_CLAIM_GRACE"):
    app.conf.pikku_reaper_options = {"claim_grace": float(os.environ["SHOP_CLAIM_GRACE"])}


# SHOP_PUBLISH_HOOK_MS: a tracing hook of the user's own that takes a few milliseconds on
# every publish (connected before pikku-celery's handlers, so it runs before them).
def _slow_publish_hook(**_: Any) -> None:
    time.sleep(float(os.environ["SHOP_PUBLISH_HOOK_MS"]) / 1000)


if os.environ.get("SHOP_PUBLISH_HOOK_MS"):
    signals.before_task_publish.connect(_slow_publish_hook, weak=False)
pikku = PikkuCelery(app, database_url=os.environ.get("SHOP_DATABASE_URL"))


def journal(event: str) -> None:
    path = os.environ.get("SHOP_JOURNAL")
    if path:
        with Path(path).open("a") as file:
            file.write(event + "\n")


@pikku.step(name="shop.reserve")
def reserve(order_id: int) -> dict[str, Any]:
    journal(f"reserve {order_id}")
    return {"order": order_id, "reserved": True}


@app.task(base=WorkflowTask, bind=True, max_retries=5, name="shop.charge")
def charge(self: Any, order: Any, fail_times: int = 2) -> dict[str, Any]:
    journal(f"charge attempt {self.request.retries + 1}")
    if self.request.retries < fail_times:
        raise self.retry(exc=ConnectionError("gateway timeout"), countdown=0)
    return {"charged": True, "order": order}


@pikku.step(name="shop.ship", retries=2, retry_delay=0)
def ship(order: Any) -> str:
    journal("ship")
    return "shipped"


@pikku.step(name="shop.always_fails", retries=2, retry_delay=0)
def always_fails(order_id: int) -> None:
    journal(f"always_fails {order_id}")
    raise ValueError(f"order {order_id} cannot be refunded")


@pikku.step(name="shop.add")
def add(x: int, y: int = 0) -> int:
    return x + y


@pikku.step(name="shop.total")
def total(values: list[int]) -> int:
    return sum(values)


@pikku.step(name="shop.add_to_all", bind=True)
def add_to_all(self: Any, nums: list[int], val: int) -> None:
    journal(f"add_to_all {nums}")
    raise self.replace(group(add.s(n, val) for n in nums))


@pikku.step(name="shop.spawn", bind=True)
def spawn(self: Any, order_id: int) -> str:
    child = notify.delay(order_id)
    return str(child.id)


@pikku.step(name="shop.notify")
def notify(order_id: int) -> str:
    return f"notified {order_id}"


@pikku.step(name="shop.flaky", bind=True, max_retries=10)
def flaky(self: Any, n: int, fails: int) -> int:
    if self.request.retries < fails:
        raise self.retry(countdown=0)
    return n


@pikku.step(name="shop.slow", acks_late=True)
def slow(seconds: float) -> str:
    marker = os.environ.get("SHOP_JOURNAL")
    journal(f"slow start {os.getpid()}")
    time.sleep(seconds)
    if marker:
        journal("slow end")
    return "slow done"


def _first_attempt_hangs(task: Any, name: str, seconds: float) -> str:
    journal(f"{name} start {os.getpid()} attempt {task.request.retries + 1}")
    if task.request.retries == 0:
        time.sleep(seconds)
    return f"{name} done"


# Acked on receipt: if the pool process dies, Celery will never deliver these again.
@pikku.step(name="shop.lose_once", bind=True, acks_late=False, retries=1, retry_delay=0)
def lose_once(self: Any, seconds: float) -> str:
    return _first_attempt_hangs(self, "lose_once", seconds)


@pikku.step(name="shop.lose_for_good", bind=True, acks_late=False, max_retries=0)
def lose_for_good(self: Any, seconds: float) -> str:
    return _first_attempt_hangs(self, "lose_for_good", seconds)


# Every fifth one retries once: the outage test checks each transition against this journal.
@pikku.step(name="shop.outage_step", bind=True, max_retries=3)
def outage_step(self: Any, n: int) -> int:
    journal(f"outage_step {n} attempt {self.request.retries + 1}")
    if n % 5 == 0 and self.request.retries == 0:
        raise self.retry(countdown=0)
    return n


@pikku.step(name="shop.noop")
def noop() -> None:
    return None


@pikku.step(name="shop.opaque")
def opaque() -> object:
    return object()


@app.task(name="shop.plain")
def plain() -> str:
    return "not mirrored"


# --- durable workflows ---------------------------------------------------------


@pikku.step(name="shop.count")
def count(label: str) -> int:
    """A side effect counted in the database itself: how often did this step really run?"""
    with pikku.store.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS shop_effects (label TEXT, pid INTEGER)")
        conn.exec_driver_sql(
            "INSERT INTO shop_effects (label, pid) VALUES (%(l)s, %(p)s)"
            if conn.dialect.name == "postgresql"
            else "INSERT INTO shop_effects (label, pid) VALUES (:l, :p)",
            {"l": label, "p": os.getpid()},
        )
    return len(label)


@pikku.workflow("checkout")
def checkout(ctx: Any, order_id: int) -> dict[str, Any]:
    order = ctx.do("reserve", reserve, order_id)
    receipt = ctx.do("charge", charge, order, 2)
    token = ctx.do("token", lambda: f"tok-{order_id}")
    ctx.state["receipt.order"] = order_id
    shipped = ctx.do("ship", ship, receipt)
    return {"receipt": receipt, "token": token, "shipped": shipped}


@pikku.workflow("refund-with-compensation")
def refund_flow(ctx: Any, order_id: int) -> str:
    try:
        ctx.do("refund", always_fails, order_id)
    except StepFailed as failure:
        ctx.do("apologise", notify, order_id)
        return f"compensated: {failure.step_name}"
    return "refunded"


@pikku.workflow("long")
def long_flow(ctx: Any, steps: int) -> int:
    total = 0
    for n in range(steps):
        total += ctx.do("add", add, n, 1)
    return total


@pikku.workflow("napper")
def napper(ctx: Any, seconds: float) -> str:
    first = ctx.do("before", count, "before-sleep")
    ctx.sleep("nap", seconds=seconds)
    second = ctx.do("after", count, "after-sleep")
    return f"{first}+{second}"


@pikku.workflow("fanout")
def fanout(ctx: Any, order_id: int) -> Any:
    try:
        return ctx.do_all([("a", add, 1, 2), ("b", always_fails, order_id), ("c", add, 3, 4)])
    except StepFailed as failure:
        return {"failed": failure.step_name}


@pikku.workflow("durable")
def durable(ctx: Any) -> list[int]:
    return [
        ctx.do("one", count, "one"),
        ctx.do("two", slow_count, "two"),
        ctx.do("three", count, "three"),
    ]


@pikku.step(name="shop.slow_count", acks_late=True)
def slow_count(label: str) -> int:
    journal(f"slow_count start {os.getpid()}")
    time.sleep(2)
    counted: int = count(label)  # a step is typed Any (pikku.step() returns Any)
    return counted


@pikku.step(name="shop.fragile")
def fragile(order_id: int) -> str:
    fixed = os.environ.get("SHOP_FIX_FILE")
    if not fixed or not Path(fixed).exists():
        raise RuntimeError(f"bug: order {order_id} trips the fragile step")
    return f"fixed {order_id}"


@pikku.workflow("fragile-flow")
def fragile_flow(ctx: Any, order_id: int) -> list[Any]:
    return [ctx.do("prep", count, f"prep-{order_id}"), ctx.do("fragile", fragile, order_id)]


@pikku.step(name="shop.parked")
def parked() -> None:
    return None


@pikku.workflow("parked-flow")
def parked_flow(ctx: Any) -> None:
    ctx.do("first", add, 1, 1)
    ctx.do("park", parked)


@pikku.workflow(
    "versioned",
    version=os.environ.get("SHOP_WORKFLOW_VERSION", "v1"),
    compatible=[v for v in os.environ.get("SHOP_COMPATIBLE", "").split(",") if v],
)
def versioned(ctx: Any) -> int:
    ctx.do("wait", slow, 1.0)
    return int(ctx.do("add", add, 20, 22))


# --- broker faults and soak ---


def _journal_attempt(task: Any) -> None:
    # Keyed by task id and attempt, so a test can hold each mirrored attempt's
    # delivery count against how often the attempt really ran.
    journal(f"{task.name} {task.request.id} {task.request.retries + 1}")


@pikku.step(name="shop.tick", bind=True)
def tick(self: Any, value: Any) -> Any:
    _journal_attempt(self)
    return value


@pikku.step(name="shop.wobbly", bind=True, max_retries=5)
def wobbly(self: Any, value: Any, fails: int) -> Any:
    _journal_attempt(self)
    if self.request.retries < fails:
        raise self.retry(exc=ConnectionError("upstream busy"), countdown=0)
    return value


@pikku.step(name="shop.linger", bind=True, acks_late=True, max_retries=3)
def linger(self: Any, value: Any, seconds: float, fails: int = 0) -> Any:
    """Long enough on its first attempt to be in flight while the broker goes away."""
    _journal_attempt(self)
    if self.request.retries == 0:
        time.sleep(seconds)
    if self.request.retries < fails:
        raise self.retry(exc=ConnectionError("upstream busy"), countdown=0)
    return value


# No result backend writes: ten thousand results would only fill the shared Redis.
@pikku.step(name="shop.soak", bind=True, max_retries=1, ignore_result=True)
def soak(self: Any, retry: bool) -> None:
    if retry and self.request.retries == 0:
        raise self.retry(countdown=0)


# --- Celery's own ways for a task to end: rejected messages and time limits ---------


@pikku.step(name="shop.dead_letter", bind=True, acks_late=True)
def dead_letter(self: Any, order_id: int) -> None:
    journal(f"dead_letter {order_id}")
    raise Reject("no such order", requeue=False)


@pikku.step(name="shop.requeue_once", bind=True, acks_late=True)
def requeue_once(self: Any, order_id: int) -> str:
    journal(f"requeue_once {order_id} redelivered={self.request.delivery_info.get('redelivered')}")
    if not _seen_before(f"requeue_once {order_id}"):
        raise Reject("not yet", requeue=True)
    return "second delivery"


@pikku.step(name="shop.overrun", time_limit=1)
def overrun(seconds: float) -> str:
    journal("overrun start")
    time.sleep(seconds)
    return "finished"  # never: the worker kills it at its hard time limit


@pikku.step(name="shop.overrun_softly", soft_time_limit=0.5)
def overrun_softly(seconds: float) -> str:
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return "cleaned up"
    return "finished"


@pikku.step(name="shop.die_after_start", acks_late=False)
def die_after_start(label: str) -> None:
    # The start of this attempt is in this process's journal, not in SQL yet (the
    # tests run it with a long flush interval); then the process dies at once.
    journal(f"die_after_start {label} {os.getpid()}")
    os.kill(os.getpid(), signal.SIGKILL)


def _seen_before(label: str) -> bool:
    """True from the second call on, across processes: a row in the shop's own table."""
    with pikku.store.engine.begin() as conn:
        seen = conn.execute(
            sa.text("SELECT count(*) FROM shop_effects WHERE label = :label"), {"label": label}
        ).scalar_one()
        conn.execute(
            sa.text("INSERT INTO shop_effects (label, pid) VALUES (:label, :pid)"),
            {"label": label, "pid": os.getpid()},
        )
    return bool(seen)


# --- recovery ----------------------------------------------------------------------


@signals.task_prerun.connect(weak=False, dispatch_uid="shop.count_replays")
def _count_replays(task: Any = None, args: Any = None, **_: Any) -> None:
    """One journal line per replay a worker runs, so tests can count them per run."""
    if task is not None and task.name == "pikku_celery.orchestrate" and args:
        journal(f"orchestrate {args[0]}")


@pikku.step(name="shop.slow_effect", acks_late=True)
def slow_effect(label: str, seconds: float) -> int:
    journal(f"slow_effect start {os.getpid()} {label}")
    time.sleep(seconds)
    counted: int = count(label)  # a step is typed Any (pikku.step() returns Any)
    return counted


@pikku.workflow("recoverable")
def recoverable(ctx: Any, tag: str, seconds: float) -> list[int]:
    return [
        ctx.do("first", count, f"{tag}-first"),
        ctx.do("slow", slow_effect, f"{tag}-slow", seconds),
        ctx.do("last", count, f"{tag}-last"),
    ]


@pikku.workflow("parked-at-once")
def parked_at_once(ctx: Any) -> None:
    ctx.do("park", parked)


@pikku.step(name="shop.quick", acks_late=False, retries=1, retry_delay=0)
def quick(label: str) -> str:
    """Acked on receipt with a retry left: a reaper that took it for lost would run it again."""
    journal(f"quick start {os.getpid()} {label}")
    journal(f"quick end {label}")
    return label


# --- child workflows, waits for events, step keys -------------------------------------


@pikku.workflow("ship-order")
def ship_order(ctx: Any, tag: str, fail: bool, seconds: float) -> dict[str, int]:
    label = ctx.do("label", count, f"{tag}-label")
    if seconds:
        ctx.do("pack", slow_effect, f"{tag}-pack", seconds)
    if fail:
        ctx.do("carrier", always_fails, 0)
    return {"label": label}


@pikku.workflow("order-with-shipping")
def order_with_shipping(ctx: Any, tag: str, fail: bool = False, seconds: float = 0) -> Any:
    ctx.do("charge", count, f"{tag}-charge")
    try:
        shipped = ctx.do("ship", ship_order, tag, fail, seconds)
    except StepFailed as failure:
        ctx.do("refund", count, f"{tag}-refund")
        return {"compensated": failure.step_name}
    ctx.do("notify", count, f"{tag}-notify")
    return shipped


@pikku.workflow("refund-approval")
def refund_approval(
    ctx: Any, amount: int, prepare: float = 0, timeout: float | None = None
) -> dict[str, Any]:
    if prepare:
        ctx.do("prepare", slow, prepare)
    try:
        decision = ctx.wait_for("approval", timeout=timeout)
    except EventTimeout:
        return {"refunded": 0, "why": "nobody decided in time"}
    ctx.branch("approved" if decision["approved"] else "declined")
    return {"refunded": amount if decision["approved"] else 0, "approved_by": decision["by"]}


@pikku.step(name="shop.keyed", bind=True, max_retries=1)
def keyed(self: Any, tag: str) -> str:
    step = current_step()
    journal(f"keyed {tag} {step.attempt} {step.idempotency_key}")
    if self.request.retries == 0:
        raise self.retry(exc=ConnectionError("payment API busy"), countdown=0)
    if not _marked(f"{tag}-fixed"):
        raise RuntimeError("payment API refused the call")
    return step.idempotency_key


def _marked(label: str) -> bool:
    """Whether the test has put a row ``label`` in the shop's own table (a fix deployed)."""
    with pikku.store.engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text("SELECT count(*) FROM shop_effects WHERE label = :label"),
                {"label": label},
            ).scalar_one()
        )


@pikku.workflow("keyed-payment")
def keyed_payment(ctx: Any, tag: str) -> str:
    return str(ctx.do("pay", keyed, tag))


@pikku.step(name="shop.retry_declared", bind=True, retries=1, retry_delay="1s")
def retry_declared(self: Any) -> int:
    """Retried once by autoretry after its declared delay."""
    if not self.request.retries:
        raise ConnectionError("the gateway is busy")
    return int(self.request.retries)


@pikku.step(name="shop.retry_countdown", bind=True, max_retries=1)
def retry_countdown(self: Any) -> int:
    """Retries itself once with the countdown it gives ``retry()``."""
    if not self.request.retries:
        raise self.retry(exc=ConnectionError("the gateway is busy"), countdown=0.1)
    return int(self.request.retries)
