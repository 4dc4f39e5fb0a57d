"""Real workers, real brokers (Redis and RabbitMQ), the PostgreSQL mirror: what users see."""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import chain, chord, group

from tests.acceptance.conftest import BROKERS, QUEUE, Worker, history_of, wait_until, worker_running


def test_a_lone_task_is_a_run_of_its_own(shop: ModuleType, worker: Worker) -> None:
    result = shop.reserve.delay(7)
    run = worker.wait_for_run(result.id)
    assert (run.workflow, run.status, run.output) == (
        "shop.reserve",
        "completed",
        {"order": 7, "reserved": True},
    )
    [attempt] = worker.store.get_run_history(result.id)
    assert (attempt.step_name, attempt.attempt, attempt.status) == ("reserve", 1, "succeeded")
    assert attempt.task_id == result.id
    assert attempt.worker is not None and attempt.worker.startswith("shop-")
    assert attempt.pid is not None and attempt.pid != worker.proc.pid  # a pool child ran it
    assert attempt.delivery_count == 1
    assert attempt.scheduled_at and attempt.running_at and attempt.succeeded_at
    assert worker.store.get_step_state(result.id, "reserve").data == {
        "args": [7],
        "kwargs": {},
    }


def test_self_retry_twice_then_success_is_three_attempts(shop: ModuleType, worker: Worker) -> None:
    result = shop.charge.delay({"order": 2}, fail_times=2)
    run = worker.wait_for_run(result.id)
    assert run.status == "completed"
    worker.wait_for_history(
        result.id, [("charge", 1, "failed"), ("charge", 2, "failed"), ("charge", 3, "succeeded")]
    )
    history = worker.store.get_run_history(result.id)
    assert history[0].error is not None
    assert history[0].error["type"] == "ConnectionError"
    assert "gateway timeout" in history[0].error["message"]
    assert "Traceback" in (history[0].error["traceback"] or "")
    # Pikku reads the traceback as `stack`: the same text on a retried attempt too.
    assert history[0].error["stack"] == history[0].error["traceback"]
    assert [a.reason for a in history] == ["first", "retry", "retry"]
    assert all(a.task_id == result.id for a in history)
    assert history[1].scheduled_at is not None and history[1].eta is not None
    for retried in history[1:]:  # due when its message was, never after it started
        assert retried.eta is not None and retried.running_at is not None
        assert retried.eta <= retried.running_at, (retried.eta, retried.running_at)
    state = worker.store.get_step_state(result.id, "charge")
    assert (state.status, state.attempt_count) == ("succeeded", 3)


def test_autoretry_exhausted_fails_step_and_run(shop: ModuleType, worker: Worker) -> None:
    result = shop.always_fails.delay(9)
    run = worker.wait_for_run(result.id)
    assert run.status == "failed"
    assert run.error is not None and "order 9 cannot be refunded" in run.error["message"]
    assert run.error["step"] == "always_fails"
    worker.wait_for_history(
        result.id,
        [
            ("always_fails", 1, "failed"),
            ("always_fails", 2, "failed"),
            ("always_fails", 3, "failed"),
        ],
    )
    assert worker.store.get_step_state(result.id, "always_fails").status == "failed"


def test_a_chain_is_one_run_of_linked_steps(shop: ModuleType, worker: Worker) -> None:
    run_id = shop.pikku.run(
        chain(shop.reserve.s(1), shop.charge.s(fail_times=1), shop.ship.s()),
        name="checkout",
        input={"order": 1},
    )
    run = worker.wait_for_run(run_id)
    assert (run.workflow, run.status, run.output, run.input) == (
        "checkout",
        "completed",
        "shipped",
        {"order": 1},
    )
    worker.wait_for_history(
        run_id,
        [
            ("reserve", 1, "succeeded"),
            ("charge", 1, "failed"),
            ("charge", 2, "succeeded"),
            ("ship", 1, "succeeded"),
        ],
    )
    steps = {s.step_name: s for s in worker.store.list_step_states(run_id)}
    assert steps["reserve"].from_step_name is None
    assert steps["charge"].from_step_name == "reserve"
    assert steps["ship"].from_step_name == "charge"
    assert steps["ship"].rpc_name == "shop.ship"


def test_a_chain_sent_on_its_own_is_a_run_under_its_result_id_ending_in_its_last_link(
    shop: ModuleType, worker: Worker
) -> None:
    """``.delay()`` of a chain returns its last link's result: the run is found under that id
    and outputs that result, whatever its first link returned."""
    result = chain(shop.add.s(1, 2), shop.add.s(10), shop.add.s(100)).delay()
    assert result.get(timeout=30) == 113
    run = worker.wait_for_run(result.id)
    assert (run.workflow, run.status, run.output) == ("shop.add", "completed", 113)
    worker.wait_for_history(
        result.id, [("add", 1, "succeeded"), ("add#2", 1, "succeeded"), ("add#3", 1, "succeeded")]
    )
    steps = {s.step_name: s for s in worker.store.list_step_states(result.id)}
    assert [steps[name].result for name in ("add", "add#2", "add#3")] == [3, 13, 113]
    assert steps["add#3"].step_id == result.id
    assert steps["add#2"].from_step_name == "add"
    assert steps["add#3"].from_step_name == "add#2"


def test_a_chain_sent_on_its_own_ending_in_a_chord_outputs_the_chords_body(
    shop: ModuleType, worker: Worker
) -> None:
    result = chain(
        shop.add.s(1, 1), chord([shop.add.s(10), shop.add.s(20)], shop.total.s())
    ).delay()
    assert result.get(timeout=30) == 34
    run = worker.wait_for_run(result.id)
    assert (run.status, run.output) == ("completed", 34)
    steps = {s.step_name: s for s in worker.store.list_step_states(result.id)}
    assert set(steps) == {"add", "add#2", "add#3", "total"}
    assert steps["total"].step_id == result.id


def test_a_group_and_a_chord_are_runs(shop: ModuleType, worker: Worker) -> None:
    group_run = shop.pikku.run(group(shop.add.s(1, 1), shop.add.s(2, 2)), name="adds")
    chord_run = shop.pikku.run(
        chord([shop.add.s(1, 1), shop.add.s(2, 2), shop.add.s(3, 3)], shop.total.s()),
        name="totals",
    )
    assert worker.wait_for_run(group_run).status == "completed"
    assert sorted(history_of(worker.store, group_run)) == [
        ("add", 1, "succeeded"),
        ("add#2", 1, "succeeded"),
    ]
    run = worker.wait_for_run(chord_run)
    assert (run.status, run.output) == ("completed", 12)
    names = {s.step_name: s for s in worker.store.list_step_states(chord_run)}
    assert set(names) == {"add", "add#2", "add#3", "total"}
    assert names["total"].from_step_name in {"add", "add#2", "add#3"}
    assert names["total"].result == 12


def test_nested_canvases_stay_in_one_run(shop: ModuleType, worker: Worker) -> None:
    run_id = shop.pikku.run(
        chain(
            shop.add.s(1, 1),
            chord([shop.add.s(10), shop.add.s(20)], shop.total.s()),
            shop.add.s(100),
        ),
        name="nested",
    )
    run = worker.wait_for_run(run_id)
    assert (run.status, run.output) == ("completed", 134)
    assert len(worker.store.list_step_states(run_id)) == 5


def test_a_child_published_from_a_step_joins_its_run(shop: ModuleType, worker: Worker) -> None:
    result = shop.spawn.delay(5)
    run = worker.wait_for_run(result.id)
    assert run.status == "completed"
    steps = {s.step_name: s for s in worker.store.list_step_states(result.id)}
    assert set(steps) == {"spawn", "notify"}
    assert steps["notify"].from_step_name == "spawn"
    assert steps["notify"].step_id == steps["spawn"].result


def test_plain_tasks_are_not_mirrored(shop: ModuleType, worker: Worker) -> None:
    result = shop.plain.delay()
    time.sleep(1)
    assert [r for r in worker.store.list_runs(limit=200) if r.run_id == result.id] == []


def test_sigkill_of_the_pool_child_is_a_redelivery_of_the_same_attempt(
    shop: ModuleType, worker: Worker
) -> None:
    result = shop.slow.delay(3)
    deadline = time.monotonic() + 20
    starts: list[str] = []
    while not starts and time.monotonic() < deadline:
        starts = [line for line in worker.journal_lines() if line.startswith("slow start")]
        time.sleep(0.05)
    assert starts, worker.log.read_text()[-3000:]
    child = int(starts[0].split()[-1])
    os.kill(child, signal.SIGKILL)
    killed_at = dt.datetime.now(dt.timezone.utc)
    run = worker.wait_for_run(result.id, timeout=60)
    assert (run.status, run.output) == ("completed", "slow done")
    [attempt] = worker.store.get_run_history(result.id)
    assert (attempt.attempt, attempt.status) == (1, "succeeded")
    assert attempt.delivery_count == 2
    assert attempt.pid != child
    # The attempt says where and since when its last delivery ran: what it took is the
    # execution that ended it, not the killed one too.
    assert attempt.running_at is not None and attempt.running_at > killed_at
    assert len([line for line in worker.journal_lines() if line.startswith("slow start")]) == 2


def test_a_revoked_task_cancels_its_step_and_run(shop: ModuleType, worker: Worker) -> None:
    result = shop.slow.delay(20)
    wait_until(
        lambda: worker.store.get_step_state(result.id, "slow").status == "running",
        timeout=20,
        what="the step to run",
    )
    shop.app.control.revoke(result.id, terminate=True, signal="SIGKILL")
    run = worker.wait_for_run(result.id, timeout=30)
    assert run.status == "cancelled"
    assert run.error is not None and "terminated" in run.error["message"]
    [attempt] = worker.store.get_run_history(result.id)
    assert attempt.status == "cancelled"
    assert worker.store.get_step_state(result.id, "slow").status == "cancelled"


@pytest.mark.parametrize("broker", list(BROKERS))
def test_a_retry_delay_is_stored_as_declared_whatever_runs_before_the_publish(
    shop: ModuleType, tmp_path: Path, broker: str
) -> None:
    """A tracing hook of the user's that takes 20 ms on each publish runs between Celery
    computing the retry's ETA and its message going out: the delay is still the one the
    task declared (``retry_delay="1s"``) or gave ``retry()`` (``countdown=0.1``)."""
    env = {"SHOP_PUBLISH_HOOK_MS": "20"}
    # A queue of its own: the module's workers, without the hook, must not take the tasks.
    queue = f"{QUEUE}-hooked"
    previous = shop.app.conf.broker_url
    try:
        with worker_running(shop, broker, tmp_path, extra_env=env, queues=queue) as worker:
            declared = shop.retry_declared.apply_async(queue=queue)
            countdown = shop.retry_countdown.apply_async(queue=queue)
            assert (declared.get(timeout=30), countdown.get(timeout=30)) == (1, 1)
            _check_declared_delays(worker, declared, countdown)
    finally:  # the module's workers' broker again, for the tests after this one
        shop.app.conf.broker_url = previous
        shop.app._after_fork()


def _check_declared_delays(worker: Worker, declared: Any, countdown: Any) -> None:
    for result, name, delay in (
        (declared, "retry_declared", "1s"),
        (countdown, "retry_countdown", "100ms"),
    ):
        assert worker.wait_for_run(result.id).status == "completed"
        worker.wait_for_history(result.id, [(name, 1, "failed"), (name, 2, "succeeded")])
        assert worker.store.get_step_state(result.id, name).retry_delay == delay
        first, second = worker.store.get_run_history(result.id)
        # The next attempt is still due when its message says.
        assert first.failed_at is not None and second.eta is not None
        assert second.eta > first.failed_at
