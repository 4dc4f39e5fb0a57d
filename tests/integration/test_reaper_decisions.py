"""What the reaper does with an attempt whose worker is gone, by run kind and broker.

Real brokers, no worker: the broadcast gets no answer, so every worker
named in the store is gone. The messages the reaper sends are read back
from the broker itself.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from pikku_celery import WorkflowStore
from pikku_celery.integration import headers as h
from pikku_celery.integration.reaper import Reaper
from pikku_celery.mirror import Recorder
from pikku_celery.store import LOST_ERROR_TYPE
from tests.acceptance.conftest import AMQP_URL, address, port_open, redis_db
from tests.conftest import service_missing
from tests.support import transitions
from tests.support.threads import run_threads

BROKER = redis_db(13)


@pytest.fixture
def app() -> Iterator[Celery]:
    host, port = address(BROKER)
    if not port_open(port, host):
        service_missing("Redis", ConnectionRefusedError(f"{host}:{port}"))
    app = Celery("reaped", broker=BROKER, set_as_current=False)
    app.conf.task_acks_late = True
    app.conf.task_default_queue = f"reaped-{uuid.uuid4().hex[:8]}"

    # A reaper acts only on steps of its own app's tasks.
    @app.task(name="reaped.charge", shared=False)
    def charge(amount: int) -> int:
        return amount

    yield app
    redis.Redis.from_url(BROKER).delete(app.conf.task_default_queue)


def _queued(app: Celery) -> list[dict[str, Any]]:
    raw = redis.Redis.from_url(BROKER).lrange(app.conf.task_default_queue, 0, -1)
    return [json.loads(message)["headers"] for message in raw]


def _running_on_a_dead_worker(store: WorkflowStore, kind: str) -> tuple[str, str]:
    run_id = store.create_run("checkout", {"args": [], "kwargs": {}}, wire={"type": kind})
    step_id = str(uuid.uuid4())
    transitions.schedule(
        store, run_id, "charge", step_id=step_id, rpc_name="reaped.charge", data={"args": [1]}
    )
    store.attempts.record_attempt(step_id, 1, "running", task_id=step_id, worker="gone@host", pid=4)
    return run_id, step_id


def _reaper(app: Celery, store: WorkflowStore, **options: Any) -> Reaper:
    replayed: list[str] = []
    return Reaper(app, store, idle_for=0, reply_timeout=0.3, replay=replayed.append, **options)


def test_a_workflow_step_of_a_gone_worker_is_dispatched_again_under_the_same_attempt(
    app: Celery, store: WorkflowStore
) -> None:
    run_id, step_id = _running_on_a_dead_worker(store, "workflow")
    sent: list[tuple[str, int]] = []
    report = _reaper(app, store, dispatched=lambda *s: sent.append(s)).reap()
    assert [a.step_id for a in report.redispatched] == [step_id]
    assert sent == [(step_id, 1)]
    assert report.awaiting_redelivery == [] and report.failed == []
    [headers] = _queued(app)
    assert (headers["id"], headers["task"], headers["retries"]) == (step_id, "reaped.charge", 0)
    assert headers[h.ORCHESTRATED] is True
    [attempt] = store.get_run_history(run_id)
    assert attempt.status == "lost" and attempt.error is not None
    assert attempt.error["type"] == LOST_ERROR_TYPE and attempt.error["redispatched"] is True
    assert "dispatched again now" in attempt.error["message"]
    assert store.get_run(run_id).status == "running"

    # The next pass leaves it to the message it sent: one dispatch, not one per pass.
    again = _reaper(app, store).reap()
    assert again.redispatched == [] and [a.step_id for a in again.awaiting_redelivery] == [step_id]
    assert len(_queued(app)) == 1


def test_a_canvas_step_of_a_gone_worker_waits_and_says_when_its_redelivery_is_due(
    app: Celery, store: WorkflowStore
) -> None:
    app.conf.broker_transport_options = {"visibility_timeout": 900}
    run_id, step_id = _running_on_a_dead_worker(store, "canvas")
    report = _reaper(app, store).reap()
    assert report.redispatched == [] and _queued(app) == []
    [waiting] = report.awaiting_redelivery
    step = store.get_step_state(run_id, "charge")
    assert step.status == "lost" and step.error is not None
    [attempt] = store.get_run_history(run_id)
    assert attempt.running_at is not None
    due = attempt.running_at + dt.timedelta(seconds=900)
    assert report.redelivery_due[step_id] == due
    assert report.as_dict()["awaiting_redelivery"][0]["redelivery_due_at"] == due.isoformat()
    assert step.error["redelivery_due_at"] == due.isoformat()
    message = step.error["message"]
    assert "cannot be dispatched again on its own" in message
    assert "visibility_timeout (900s)" in message and f"{due:%Y-%m-%d %H:%M:%S} UTC" in message
    assert waiting.step_id == step_id


def test_on_rabbitmq_the_broker_redelivers_and_the_reaper_sends_nothing(
    store: WorkflowStore,
) -> None:
    host, port = address(AMQP_URL)
    if not port_open(port, host):
        service_missing("RabbitMQ", ConnectionRefusedError(f"{host}:{port}"))
    app = Celery("reaped-amqp", broker=AMQP_URL, set_as_current=False)
    app.conf.task_acks_late = True

    @app.task(name="reaped.charge", shared=False)
    def charge(amount: int) -> int:
        return amount

    run_id, step_id = _running_on_a_dead_worker(store, "workflow")
    report = _reaper(app, store).reap()
    assert report.redispatched == []
    assert [a.step_id for a in report.awaiting_redelivery] == [step_id]
    assert step_id not in report.redelivery_due  # due at once, when the connection dropped
    error = store.get_step_state(run_id, "charge").error
    assert error is not None and error["redispatched"] is False


def test_a_claim_whose_message_never_went_out_is_sent_once(
    app: Celery, store: WorkflowStore
) -> None:
    run_id = store.create_run("checkout", {"args": [], "kwargs": {}}, wire={"type": "workflow"})
    step_id = str(uuid.uuid4())
    assert store.claims.claim_step(
        run_id, step_id, "charge", "reaped.charge", {"args": [7], "kwargs": {}}
    )
    assert _reaper(app, store, claim_grace=60).reap().unsent_sent == []  # not overdue yet
    sent: list[tuple[str, int]] = []
    report = _reaper(app, store, claim_grace=0, dispatched=lambda *s: sent.append(s)).reap()
    assert [c.step_id for c in report.unsent_sent] == [step_id]
    [headers] = _queued(app)
    assert (headers["id"], headers[h.RUN_ID]) == (step_id, run_id)
    assert sent == [(step_id, 1)]  # the mirror is told, and records the attempt published
    # Sent just now: its grace starts again, so the next pass sends nothing.
    assert _reaper(app, store, claim_grace=5).reap().unsent_sent == []
    assert len(_queued(app)) == 1


def test_two_reapers_at_once_dispatch_a_lost_workflow_step_once(
    app: Celery, store: WorkflowStore
) -> None:
    _, step_id = _running_on_a_dead_worker(store, "workflow")
    reports: list[Any] = []
    lock = threading.Lock()

    def reap(_: int) -> None:
        report = _reaper(app, store).reap()
        with lock:
            reports.append(report)

    run_threads(2, reap)
    assert sum(len(r.redispatched) for r in reports) == 1
    assert [h["id"] for h in _queued(app)] == [step_id]


def test_a_worker_that_was_only_slow_cannot_undo_the_re_dispatch_that_won(
    app: Celery, store: WorkflowStore, tmp_path: Path
) -> None:
    run_id, step_id = _running_on_a_dead_worker(store, "workflow")
    assert _reaper(app, store).reap().redispatched  # "gone@host" did not answer in time
    mirror = Recorder(store, journal_dir=tmp_path, background=False)
    # The re-dispatch runs on another worker and succeeds first...
    mirror.started(step_id, 1, worker="fresh@host", pid=8)
    mirror.succeeded(None, step_id, 1, "second", orchestrated=True)
    assert mirror.flush()
    # ...then the slow original ends too: its late outcome changes nothing.
    mirror.succeeded(None, step_id, 1, "first", orchestrated=True)
    mirror.ended(None, step_id, 1, "failed", {"type": "Late", "message": "late"}, orchestrated=True)
    assert mirror.flush()
    step = store.get_step(step_id)
    assert (step.status, step.result, step.error) == ("succeeded", "second", None)
    [attempt] = store.get_run_history(run_id)
    assert (attempt.attempt, attempt.status, attempt.result, attempt.worker) == (
        1,
        "succeeded",
        "second",
        "fresh@host",
    )
    assert attempt.delivery_count == 2  # the original delivery and the re-dispatch
    mirror.close()
