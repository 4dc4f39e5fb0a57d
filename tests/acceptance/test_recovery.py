"""Durable workflows recover from a crash within seconds, on real workers, brokers and SQL.

Each test starts its own workers; every step's side effect is counted in the
database (``shop_effects``), outside the mirror, and each run must finish with
every step that succeeded having run exactly once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import uuid
from collections import Counter
from types import ModuleType

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.integration import control
from pikku_celery.store import LOST_ERROR_TYPE
from tests.acceptance.conftest import Worker, effects, start_worker, wait_until, worker_running


def _slow_running(worker: Worker, run_id: str) -> None:
    wait_until(
        lambda: (
            any(line.startswith("slow_effect start") for line in worker.journal_lines())
            and worker.store.get_step_state(run_id, "slow").status == "running"
        ),
        timeout=45,
        what="the slow step running",
    )


def _starts(worker: Worker, tag: str) -> int:
    return sum(
        line.startswith("slow_effect start") and line.endswith(f"{tag}-slow")
        for line in worker.journal_lines()
    )


def _each_step_once(worker: Worker, tag: str) -> None:
    assert [effects(worker, f"{tag}-{step}") for step in ("first", "slow", "last")] == [1, 1, 1]


def _nothing_left_open(worker: Worker, run_id: str) -> None:
    states = {s.step_name: s.status for s in worker.store.list_step_states(run_id)}
    assert states == {"first": "succeeded", "slow": "succeeded", "last": "succeeded"}


@pytest.mark.parametrize("same_name", [True, False], ids=["same-nodename", "new-nodename"])
def test_a_workflow_step_of_a_killed_worker_goes_on_within_seconds_on_redis(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory, same_name: bool
) -> None:
    tmp = tmp_path_factory.mktemp("killed-redis")
    tag = f"redis-{uuid.uuid4().hex[:8]}"
    name = f"restarting-{uuid.uuid4().hex[:6]}@%h"
    # The same name comes back with a short visibility timeout, so the broker's own
    # late redelivery of the killed message arrives in the test, after the re-dispatched
    # step has succeeded: 25 s leaves room for a worker slow to start on a busy machine
    # (with 15 s, the redelivery once came while the re-dispatch still ran, and a
    # duplicate of a step that has not succeeded yet runs its body: at-least-once).
    env = {"SHOP_VISIBILITY_TIMEOUT": "25"} if same_name else {}
    with worker_running(shop, "redis", tmp, nodename=name, extra_env=env) as first:
        run_id = shop.recoverable.start(tag, 4)
        _slow_running(first, run_id)
        first.kill_all()
    with worker_running(
        shop, "redis", tmp, nodename=name if same_name else None, extra_env=env
    ) as second:
        ready = time.monotonic()
        run = second.wait_for_run(run_id, timeout=30)
        recovered = time.monotonic() - ready
        assert (run.status, run.output) == (
            "completed",
            [len(f"{tag}-{s}") for s in ("first", "slow", "last")],
        )
        assert recovered < 30
        _each_step_once(second, tag)
        _nothing_left_open(second, run_id)
        [slow] = [a for a in second.store.get_run_history(run_id) if a.step_name == "slow"]
        assert (slow.attempt, slow.status, slow.error) == (1, "succeeded", None)
        assert _starts(second, tag) == 2  # the killed execution and the re-dispatch
        if same_name:
            # An hour later in production, 25 s here: Redis hands the killed message
            # out again. The step succeeded, so it answers with its stored result.
            wait_until(
                lambda: (
                    [
                        a.delivery_count
                        for a in second.store.get_run_history(run_id)
                        if a.step_name == "slow"
                    ]
                    == [3]
                ),
                timeout=50,
                what="the broker's late redelivery",
            )
            time.sleep(0.5)
            assert _starts(second, tag) == 2
            _each_step_once(second, tag)
            assert second.store.get_run(run_id).status == "completed"
    how = "same" if same_name else "new"
    print(f"\nrecovery after SIGKILL on Redis ({how} name): {recovered:.1f}s")


def test_a_workflow_step_of_a_killed_worker_goes_on_at_once_on_rabbitmq(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("killed-rabbitmq")
    tag = f"amqp-{uuid.uuid4().hex[:8]}"
    with worker_running(shop, "rabbitmq", tmp) as first:
        run_id = shop.recoverable.start(tag, 4)
        _slow_running(first, run_id)
        first.kill_all()
    with worker_running(shop, "rabbitmq", tmp) as second:
        ready = time.monotonic()
        run = second.wait_for_run(run_id, timeout=30)
        recovered = time.monotonic() - ready
        assert run.status == "completed"
        _each_step_once(second, tag)
        _nothing_left_open(second, run_id)
        # RabbitMQ gave the message back when the connection dropped: its redelivery
        # runs the step, and the reaper does not dispatch it a second time.
        time.sleep(3)
        assert _starts(second, tag) == 2
        [slow] = [a for a in second.store.get_run_history(run_id) if a.step_name == "slow"]
        assert (slow.status, slow.delivery_count) == ("succeeded", 2)
    print(f"\nrecovery after SIGKILL on RabbitMQ: {recovered:.1f}s")


def test_a_replay_killed_between_claiming_a_step_and_sending_it_is_finished(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("claim-window")
    tag = f"claim-{uuid.uuid4().hex[:8]}"
    env = {
        "PIKKU_TEST_CRASH_AT": "after_claim:slow",
        "SHOP_REAPER_INTERVAL": "2",
        "SHOP_CLAIM_GRACE": "3",
    }
    with worker_running(shop, "redis", tmp, extra_env=env) as worker:
        run_id = shop.recoverable.start(tag, 0.2)
        try:
            run = worker.wait_for_run(run_id, timeout=45)
        except AssertionError as exc:
            os.kill(worker.proc.pid, signal.SIGUSR1)  # Celery logs every thread's stack
            time.sleep(1)
            stacks = worker.log.read_text()[-8000:]
            raise AssertionError(f"{_claims_seen(shop)}\n{exc}\n{stacks}") from None
        assert run.status == "completed"
        log = worker.log.read_text()
        # The replay's pool process died at the crash point (Celery saw it SIGKILLed)...
        assert "signal 9 (SIGKILL)" in log, log[-3000:]
        # ...after the claim: the reaper sent the step that nobody had sent.
        assert "died before it sent the step" in log, log[-3000:]
        _each_step_once(worker, tag)
        _nothing_left_open(worker, run_id)
        assert _starts(worker, tag) == 1


def test_a_worker_main_process_killed_before_it_commits_its_pools_events_loses_none(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The pool processes only append; the main process writes their journals. It dies
    # at the batch holding the task's end, before COMMIT (its pool processes with it,
    # idle: Celery's pool processes die with their parent): the next worker writes it.
    tmp = tmp_path_factory.mktemp("node-crash")
    spool = {"PIKKU_JOURNAL_DIR": str(tmp / "spool")}
    crash = {**spool, "PIKKU_TEST_CRASH_AT": "before_commit:node"}
    with worker_running(shop, "redis", tmp, extra_env=crash) as first:
        task_id = shop.outage_step.delay(1).id
        wait_until(lambda: first.proc.poll() is not None, what="the crash point")
        assert first.proc.returncode == -signal.SIGKILL
    assert first.journal_lines() == ["outage_step 1 attempt 1"]
    # This process's publish lands within its flush interval (the crash may come first).
    wait_until(lambda: shop.pikku.store.get_run(task_id), what="the task's publish")
    assert shop.pikku.store.get_run(task_id).status != "completed"
    assert list((tmp / "spool").glob("*/*-node*.journal")), "the pool's journal stays"
    with worker_running(shop, "redis", tmp, extra_env=spool) as second:
        run = second.wait_for_run(task_id, timeout=60)
        log = second.log.read_text()
    assert (run.status, run.output) == ("completed", 1)
    assert "left in" in log  # the dead node's journals, written by the next worker
    history = shop.pikku.store.get_run_history(task_id)
    assert [(a.attempt, a.status) for a in history] == [(1, "succeeded")]
    assert second.journal_lines() == ["outage_step 1 attempt 1"]  # it ran once
    assert not list((tmp / "spool").glob("*/*.journal"))


def _claims_seen(shop: ModuleType) -> str:
    """What the reaper would see of unsent claims now: for a failure's message."""
    store = shop.pikku.store
    claims = store.reaping.unsent_claims(older_than=0)
    view = control.ask(shop.app, [c.step_id for c in claims], 1.0)
    with store.engine.connect() as conn:
        leases = conn.execute(sa.text("SELECT * FROM pikku_celery_leases")).all()
    return f"unsent claims {claims}; workers {view}; leases {leases}; now {time.time()}"


def test_three_workers_starting_together_replay_each_unsettled_run_at_most_twice(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("fleet")
    store = shop.pikku.store
    workflow = shop.parked_at_once
    store.versions.upsert_workflow_version(
        workflow.name, workflow.version, workflow.graph, "python"
    )
    run_ids = [
        store.create_run(
            workflow.name,
            {"args": [], "kwargs": {}},
            graph_hash=workflow.version,
            wire={"type": "workflow"},
        )
        for _ in range(1000)
    ]
    with contextlib.ExitStack() as stack:
        # Settled at the end, so that no later test's worker recovers them too.
        stack.callback(_cancel_all, store, workflow.name)
        workers = [
            stack.enter_context(
                contextlib.contextmanager(start_worker)(shop, "redis", tmp, wait_ready=False)
            )
            for _ in range(3)
        ]
        for worker in workers:
            worker.wait_ready()

        def claimed() -> int:
            return sum(1 for run_id in run_ids[::50] if store.list_step_states(run_id))

        wait_until(lambda: claimed() == len(run_ids[::50]), timeout=90, what="every run replayed")
        replays = _replays_settled(workers[0], set(run_ids))
        for run_id in run_ids[::100]:
            [park] = store.list_step_states(run_id)
            assert (park.step_name, park.status) == ("park", "scheduled")
    per_run = Counter(replays[run_id] for run_id in run_ids)
    assert min(replays[run_id] for run_id in run_ids) >= 1
    assert max(replays[run_id] for run_id in run_ids) <= 2, per_run
    print(f"\nreplays per run at a fleet start of 3 workers, 1,000 runs: {dict(per_run)}")


def _cancel_all(store: WorkflowStore, workflow: str) -> None:
    """Settle the workflow's runs and their steps: later tests see none of them."""
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE workflow_step SET status = 'cancelled' WHERE status = 'scheduled'"
                " AND workflow_run_id IN"
                " (SELECT workflow_run_id FROM workflow_runs WHERE workflow = :workflow)"
            ),
            {"workflow": workflow},
        )
        conn.execute(
            sa.text(
                "UPDATE workflow_runs SET status = 'cancelled'"
                " WHERE workflow = :workflow AND status IN ('running', 'suspended')"
            ),
            {"workflow": workflow},
        )


def _replays_settled(worker: Worker, run_ids: set[str], quiet: float = 3.0) -> Counter[str]:
    """Replays per run, counted once no new replay has run for ``quiet`` seconds."""
    last, since = -1, time.monotonic()
    while True:
        lines = [line for line in worker.journal_lines() if line.startswith("orchestrate ")]
        if len(lines) != last:
            last, since = len(lines), time.monotonic()
        elif time.monotonic() - since > quiet:
            return Counter(line.split()[1] for line in lines if line.split()[1] in run_ids)
        time.sleep(0.2)


def test_without_beat_the_workers_find_a_lost_attempt_within_two_intervals(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("no-beat")
    interval = 3.0
    env = {"SHOP_REAPER_INTERVAL": str(interval)}
    with worker_running(shop, "redis", tmp, extra_env=env) as first:
        result = shop.lose_for_good.delay(30)  # acked on receipt: nothing redelivers it
        wait_until(
            lambda: first.store.get_step_state(result.id, "lose_for_good").status == "running",
            what="the task running",
        )
        first.kill_all()
    with worker_running(shop, "redis", tmp, extra_env=env) as second:
        ready = time.monotonic()
        wait_until(
            lambda: second.store.get_run(result.id).status == "failed",
            timeout=2 * interval,
            what="the lost attempt handled",
        )
        found = time.monotonic() - ready
        run = second.store.get_run(result.id)
        assert run.error is not None and run.error["type"] == LOST_ERROR_TYPE
        assert second.store.get_step_state(result.id, "lose_for_good").status == "failed"
    print(f"\nlost attempt handled without beat {found:.1f}s after the worker was ready")


def test_the_workers_reaper_can_be_turned_off(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("reaper-off")
    with worker_running(shop, "redis", tmp) as first:
        result = shop.lose_for_good.delay(30)
        wait_until(
            lambda: first.store.get_step_state(result.id, "lose_for_good").status == "running",
            what="the task running",
        )
        first.kill_all()
    with worker_running(shop, "redis", tmp, extra_env={"SHOP_REAPER_INTERVAL": "0"}):
        time.sleep(4)
        assert shop.pikku.store.get_step_state(result.id, "lose_for_good").status == "running"
    assert shop.pikku.reap(idle_for=0, reply_timeout=1).failed  # beat or cron still can


def test_the_reaper_leaves_an_attempt_whose_end_still_waits_in_a_live_journal(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("journaled-end")
    nodename = f"journaled-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    # The worker flushes every 30 s: the task's start and end stay in its journal.
    env = {"SHOP_FLUSH_INTERVAL": "30", "SHOP_REAPER_INTERVAL": "0"}
    label = uuid.uuid4().hex[:8]
    with worker_running(shop, "redis", tmp, nodename=nodename, extra_env=env) as worker:
        result = shop.quick.delay(label)
        wait_until(lambda: f"quick end {label}" in worker.journal_lines(), what="the task done")
        [start] = [line for line in worker.journal_lines() if line.startswith("quick start")]
        # SQL as it is when the start was flushed and the end was not yet: running.
        wait_until(
            lambda: shop.pikku.store.get_step_state(result.id, "quick").status == "scheduled",
            what="the publish in SQL",
        )
        shop.pikku.store.attempts.record_attempt(
            result.id, 1, "running", task_id=result.id, worker=nodename, pid=int(start.split()[2])
        )
        report = shop.pikku.reap(idle_for=0, reply_timeout=1)
        touched = report.lost + report.retried + report.failed + report.redispatched
        assert result.id not in [a.step_id for a in touched]
        assert shop.pikku.store.get_step_state(result.id, "quick").status == "running"
        worker.stop()  # a warm shutdown flushes the journal
        run = worker.wait_for_run(result.id, timeout=20)
        assert (run.status, run.output) == ("completed", label)
        assert [(a.attempt, a.status) for a in worker.store.get_run_history(result.id)] == [
            (1, "succeeded")
        ]
        assert sum(line.startswith("quick start") for line in worker.journal_lines()) == 1
