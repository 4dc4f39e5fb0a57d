"""Known runs to show, a recording stand-in for the app's run actions, and clients."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.dashboard import create_app

# The acceptance suite's users' app, for the browser test's real worker.
from tests.acceptance.conftest import shop as shop
from tests.support import transitions

XSS = "<script>alert('pwned')</script>"
PASSWORD = "s3cret-pass"


@dataclass(frozen=True)
class Seeded:
    failed: str  # "checkout": step "charge" failed three times, the run failed
    completed: str  # "checkout": step "reserve" succeeded once
    running: str  # "report": step "build" is running its first attempt
    charge_step: str


def seed(store: WorkflowStore) -> Seeded:
    """Three runs whose every count is known; user data carries markup to be escaped."""
    failed = store.create_run("checkout", {"order": 1, "note": XSS})
    charge = str(uuid.uuid4())
    transitions.schedule(
        store, failed, "charge", step_id=charge, rpc_name="shop.charge", data={"args": [1]}
    )
    for attempt in (1, 2, 3):
        store.attempts.record_attempt(
            charge, attempt, "running", task_id=charge, worker="w1@host", pid=41
        )
        store.attempts.record_attempt(
            charge,
            attempt,
            "failed",
            error={
                "type": "ConnectionError",
                "message": f"gateway timeout {XSS}",
                "traceback": f"Traceback (most recent call last):\n  {XSS}\nConnectionError",
            },
        )
        if attempt < 3:
            store.attempts.record_attempt(
                charge, attempt + 1, "scheduled", task_id=charge, reason="retry"
            )
    store.attempts.settle_run(failed, "failed", {"type": "ConnectionError", "message": XSS})

    completed = store.create_run("checkout", {"order": 2})
    reserve = str(uuid.uuid4())
    transitions.schedule(
        store, completed, "reserve", step_id=reserve, rpc_name="shop.reserve", data={}
    )
    store.attempts.record_attempt(reserve, 1, "running", task_id=reserve, worker="w1@host", pid=42)
    store.attempts.record_attempt(reserve, 1, "succeeded", result={"reserved": True})
    store.attempts.complete_run_if_done(completed)

    running = store.create_run("report", {})
    build = str(uuid.uuid4())
    transitions.schedule(store, running, "build", step_id=build, data={})
    store.attempts.record_attempt(build, 1, "running", task_id=build, worker="w2@host", pid=43)
    return Seeded(failed=failed, completed=completed, running=running, charge_step=charge)


# What the reaper stores as a lost attempt's error.
LOST_ERROR = {
    "type": "pikku_celery.WorkerLost",
    "message": f"Attempt 1 of step 'ship' was lost on w9@host: its worker does not answer {XSS}",
    "traceback": None,
    "worker": "w9@host",
    "pid": 99,
    "lost_at": "2026-01-01T12:00:05+00:00",
    "redelivery_expected": False,
    "step": "ship",
}


def lost_run(
    store: WorkflowStore, error: dict[str, Any] | None = None, wire: dict[str, Any] | None = None
) -> tuple[str, str]:
    """A running run whose step "ship" ran on a worker that died: its attempt 1 is lost."""
    run_id = store.create_run("delivery", {"parcel": 7}, wire=wire)
    ship = str(uuid.uuid4())
    transitions.schedule(store, run_id, "ship", step_id=ship, rpc_name="shop.ship", data={})
    store.attempts.record_attempt(ship, 1, "running", task_id=ship, worker="w9@host", pid=99)
    assert store.reaping.mark_lost(ship, 1, 1, error or LOST_ERROR)
    return run_id, ship


@dataclass
class RecordingActions:
    """Stands in for the application's RunActions: records each call."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def resume(self, run_id: str) -> None:
        self.calls.append(("resume", run_id))

    def rerun(self, run_id: str, from_step: str) -> None:
        self.calls.append(("rerun", run_id, from_step))

    def cancel(self, run_id: str) -> None:
        self.calls.append(("cancel", run_id))

    def send(self, run_id: str, name: str, data: Any = None) -> None:
        self.calls.append(("send", run_id, name, data))


@pytest.fixture
def seeded(store: WorkflowStore) -> Seeded:
    return seed(store)


@pytest.fixture
def client(store: WorkflowStore) -> Iterator[TestClient]:
    with TestClient(create_app(store, flower_url="http://flower.example:5555/")) as test_client:
        yield test_client


def csrf_token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no action form"
    return match.group(1)
