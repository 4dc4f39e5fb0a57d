"""Tests that need the broker's queue to themselves: each starts (and kills) its own workers.

No other worker may run meanwhile, so this module has no module-wide worker.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from pikku_celery.errors import RunFailed
from tests.acceptance.conftest import effects, wait_until, worker_running


def test_many_immediate_retries_on_four_processes_converge(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # countdown=0: attempt K+1 often starts in another process before the
    # retry handler of attempt K has committed. Every history must still be right.
    with worker_running(shop, "redis", tmp_path_factory.mktemp("four"), concurrency=4) as worker:
        ids = [shop.flaky.delay(n, 3).id for n in range(60)]
        expected = [
            ("flaky", 1, "failed"),
            ("flaky", 2, "failed"),
            ("flaky", 3, "failed"),
            ("flaky", 4, "succeeded"),
        ]
        for n, task_id in enumerate(ids):
            run = worker.wait_for_run(task_id)
            assert (run.status, run.output) == ("completed", n)
            worker.wait_for_history(task_id, expected)
            state = worker.store.get_step_state(task_id, "flaky")
            assert (state.status, state.attempt_count, state.result) == ("succeeded", 4, n)


def test_a_database_that_never_answers_fails_no_task(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("dead-db")
    dead = {
        "SHOP_DATABASE_URL": "postgresql://nobody:s3cret@127.0.0.1:1/none",
        "PIKKU_JOURNAL_DIR": str(tmp / "spool"),
    }
    with worker_running(shop, "redis", tmp, extra_env=dead) as worker:
        result = shop.charge.delay({"order": 4}, fail_times=1)
        assert result.get(timeout=30) == {"charged": True, "order": {"order": 4}}
        assert shop.add.delay(2, 3).get(timeout=30) == 5
        # The events wait in the spool: the node's flusher says so when its write fails,
        # which may come after the tasks' own lines.
        wait_until(
            lambda: "keeping mirror events in" in worker.log.read_text(),
            timeout=15,
            what="the flusher to say where the events wait",
        )
        log = worker.log.read_text()
        assert "s3cret" not in log
        assert "succeeded in" in log  # Celery's own line: the task itself went fine
        assert "raised unexpected" not in log


def test_resume_after_the_bug_is_fixed_keeps_what_succeeded(
    shop: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    fix = tmp_path / "fixed"
    with worker_running(
        shop, "redis", tmp_path_factory.mktemp("resume"), extra_env={"SHOP_FIX_FILE": str(fix)}
    ) as worker:
        run_id = shop.fragile_flow.start(2)
        with pytest.raises(RunFailed):
            shop.pikku.wait(run_id, timeout=45)
        fix.write_text("deployed")
        assert shop.pikku.resume(run_id) == ["fragile"]
        assert shop.pikku.wait(run_id, timeout=45) == [6, "fixed 2"]
        history = worker.store.get_run_history(run_id)
        assert [(a.step_name, a.attempt, a.status, a.reason) for a in history] == [
            ("prep", 1, "succeeded", "first"),
            ("fragile", 1, "failed", "first"),
            ("fragile", 2, "succeeded", "resume"),
        ]
        assert effects(worker, "prep-2") == 1


def test_a_sleep_outlives_a_worker_restart(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("sleep")
    run_id = ""
    with worker_running(shop, "redis", tmp) as first:
        run_id = shop.napper.start(3.0)
        wait_until(lambda: first.store.get_run(run_id).status == "suspended", what="the nap")
        first.stop()  # a deploy: the wake-up message goes back to the broker
    with worker_running(shop, "redis", tmp) as second:
        assert shop.pikku.wait(run_id, timeout=45) == "12+11"
        nap = second.store.get_step_state(run_id, "nap")
        assert nap.status == "succeeded"
        [attempt] = [a for a in second.store.get_run_history(run_id) if a.step_name == "nap"]
        assert attempt.eta is not None and attempt.succeeded_at is not None
        assert attempt.succeeded_at >= attempt.eta


def test_killed_workers_between_and_during_steps_lose_nothing_and_redo_nothing(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("durable")
    fast = {"SHOP_VISIBILITY_TIMEOUT": "3"}
    run_id = ""
    with worker_running(shop, "redis", tmp, extra_env=fast) as first:
        run_id = shop.durable.start()
        # Killed once step two's message is out: a replay killed between claiming a
        # step and publishing it leaves the step waiting (a known gap, not tested here).
        wait_until(
            lambda: "shop.slow_count[" in first.log.read_text(),
            what="step two's message",
        )
        first.kill_all()  # between steps: one is done, two is just starting
    with worker_running(shop, "redis", tmp, extra_env=fast) as second:
        wait_until(
            lambda: (
                any(line.startswith("slow_count start") for line in second.journal_lines())
                and second.store.get_step_state(run_id, "two").status == "running"
            ),
            what="step two running",
        )
        second.kill_all()  # during a step
    with worker_running(shop, "redis", tmp, extra_env=fast) as third:
        assert shop.pikku.wait(run_id, timeout=60) == [3, 3, 5]
        assert [effects(third, label) for label in ("one", "two", "three")] == [1, 1, 1]
        two = [a for a in third.store.get_run_history(run_id) if a.step_name == "two"]
        assert [a.status for a in two] == ["succeeded"]
        assert two[0].delivery_count >= 2  # the killed execution, then the one that finished


def test_a_version_conflict_fails_the_run_unless_declared_compatible(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("versions")
    assert shop.versioned.version == "v1"
    with worker_running(shop, "redis", tmp, extra_env={"SHOP_WORKFLOW_VERSION": "v2"}):
        run_id = shop.versioned.start()
        with pytest.raises(RunFailed, match="VERSION_CONFLICT"):
            shop.pikku.wait(run_id, timeout=30)
        error = shop.pikku.store.get_run(run_id).error
        assert error["code"] == "VERSION_CONFLICT"
        assert "'v1'" in error["message"] and "'v2'" in error["message"]
        assert shop.pikku.store.list_step_states(run_id) == []  # nothing mixed
    compatible = {"SHOP_WORKFLOW_VERSION": "v2", "SHOP_COMPATIBLE": "v1"}
    with worker_running(shop, "redis", tmp, extra_env=compatible):
        run_id = shop.versioned.start()
        assert shop.pikku.wait(run_id, timeout=30) == 42
