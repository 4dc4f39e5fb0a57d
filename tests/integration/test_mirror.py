"""The mirror between Celery's events and the store: isolated, convergent, never in the way."""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.integration.mirror import CeleryMirror, PublishedStep
from pikku_celery.store.attempt_writes import NewRun

Event = Callable[[CeleryMirror, str, str], None]


def publish(mirror: CeleryMirror) -> tuple[str, str]:
    step_id = str(uuid.uuid4())
    name = mirror.published(
        PublishedStep(
            run_id=step_id,
            step_id=step_id,
            step_name="charge",
            rpc_name="shop.charge",
            data={"args": [1], "kwargs": {}},
            new_run=NewRun("shop.charge", {"args": [1]}),
        )
    )
    assert name == "charge"
    return step_id, step_id


def adopt_nothing() -> PublishedStep:
    raise AssertionError("the step was published; nothing to adopt")


# What the handlers hand the mirror for: attempt 1 retried, attempt 2 succeeds.
STORY: list[tuple[str, Event]] = [
    ("1 started", lambda m, r, s: m.started(s, 1, worker="w", pid=1, adopt=adopt_nothing)),
    (
        "1 retried",
        lambda m, r, s: m.retried(
            s,
            1,
            {"type": "ValueError", "message": "t", "traceback": None},
            dt.datetime.now(dt.timezone.utc),
        ),
    ),
    ("2 started", lambda m, r, s: m.started(s, 2, worker="w", pid=2, adopt=adopt_nothing)),
    ("2 succeeded", lambda m, r, s: m.succeeded(r, s, 2, {"ok": True})),
]


def test_handlers_events_in_every_order_converge(store: WorkflowStore) -> None:
    mirror = CeleryMirror(store)
    outcomes = set()
    for order in itertools.permutations(STORY):
        run_id, step_id = publish(mirror)
        for _, event in order:
            event(mirror, run_id, step_id)
        for _, event in order[:2]:  # and some of them again: duplicates
            event(mirror, run_id, step_id)
        history = store.get_run_history(run_id)
        outcomes.add(
            (
                store.get_run(run_id).status,
                store.get_run(run_id).output == {"ok": True},
                tuple((a.attempt, a.status) for a in history),
                store.get_step_state(run_id, "charge").status,
            )
        )
    assert outcomes == {("completed", True, ((1, "failed"), (2, "succeeded")), "succeeded")}


def test_a_result_that_is_not_json_is_kept_as_a_marked_placeholder(
    store: WorkflowStore,
) -> None:
    mirror = CeleryMirror(store)
    run_id, step_id = publish(mirror)
    mirror.started(step_id, 1, worker="w", pid=1, adopt=adopt_nothing)
    mirror.succeeded(run_id, step_id, 1, {1, 2, 3})
    [attempt] = store.get_run_history(run_id)
    assert attempt.status == "succeeded"
    assert attempt.result == {
        "__pikku_unserialisable__": True,
        "type": "builtins.set",
        "repr": "{1, 2, 3}",
    }
    assert store.get_run(run_id).status == "completed"


def test_a_step_published_elsewhere_is_adopted_when_it_starts(store: WorkflowStore) -> None:
    mirror = CeleryMirror(store)
    step_id = str(uuid.uuid4())
    mirror.started(
        step_id,
        1,
        worker="w",
        pid=3,
        adopt=lambda: PublishedStep(
            run_id=step_id,
            step_id=step_id,
            step_name="ship",
            rpc_name="shop.ship",
            data={},
            new_run=NewRun("shop.ship", {}),
        ),
    )
    [attempt] = store.get_run_history(step_id)
    assert (attempt.step_name, attempt.status, attempt.pid) == ("ship", "running", 3)


def test_an_unreachable_database_never_raises_and_keeps_events_in_the_spool(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    dead = WorkflowStore("postgresql://nobody:s3cret@127.0.0.1:1/none")
    mirror = CeleryMirror(dead, retry_delays=(0.01,), spool_dir=tmp_path, drain_interval=60)
    with caplog.at_level(logging.WARNING, logger="pikku_celery.integration.mirror"):
        assert publish_quietly(mirror) is None
        mirror.succeeded("r", "s", 1, "result")
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions == ["mirror_spooling"]  # said once per outage, not once per event
    assert "cannot reach the workflow database" in caplog.records[0].getMessage()
    assert "s3cret" not in caplog.records[0].getMessage()
    assert mirror.spool_depth == 2
    mirror.close()
    assert mirror.spool_folder.is_dir() and any(mirror.spool_folder.glob("*.spool"))
    dead.close()


def publish_quietly(mirror: CeleryMirror) -> str | None:
    return mirror.published(
        PublishedStep(run_id="r", step_id="s", step_name="n", rpc_name="t", data={})
    )
