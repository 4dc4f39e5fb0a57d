"""Claimed steps whose message never went out: marked when it does, found when it did not.

A durable workflow's replay claims a step in SQL, then sends its message.
The mirror marks the attempt once the message is out (its task id); a claim
without the mark, long after it was made, is a replay that died in between.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

from pikku_celery import WorkflowStore
from pikku_celery.mirror import Recorder
from pikku_celery.mirror.journal import Journal, journaled_steps


def _claimed(store: WorkflowStore, rpc_name: str = "shop.charge") -> tuple[str, str]:
    run_id = store.create_run("checkout", {"args": [], "kwargs": {}}, wire={"type": "workflow"})
    step_id = str(uuid.uuid4())
    assert store.claims.claim_step(run_id, step_id, "charge", rpc_name, {"args": [1], "kwargs": {}})
    return run_id, step_id


def test_a_claim_is_unsent_until_its_dispatch_reaches_sql(
    store: WorkflowStore, tmp_path: Path
) -> None:
    run_id, step_id = _claimed(store)
    _, sent = _claimed(store)
    mirror = Recorder(store, journal_dir=tmp_path, background=False)
    mirror.dispatched(sent, 1)
    assert mirror.flush()
    time.sleep(0.05)
    [unsent] = store.reaping.unsent_claims(older_than=0)
    assert (unsent.run_id, unsent.step_id, unsent.step_name, unsent.attempt) == (
        run_id,
        step_id,
        "charge",
        1,
    )
    assert unsent.run_kind == "workflow" and unsent.data == {"args": [1], "kwargs": {}}
    assert store.reaping.unsent_claims(older_than=60) == []  # not overdue yet
    [attempt] = store.get_run_history(run_id)
    assert attempt.status == "scheduled" and attempt.task_id is None
    mirror.close()


def test_a_dispatch_that_comes_after_the_step_started_changes_nothing(
    store: WorkflowStore, tmp_path: Path
) -> None:
    run_id, step_id = _claimed(store)
    mirror = Recorder(store, journal_dir=tmp_path, background=False)
    mirror.started(step_id, 1, worker="w1@host", pid=7)
    mirror.succeeded(None, step_id, 1, "ok", orchestrated=True)
    assert mirror.flush()
    mirror.dispatched(step_id, 1)
    assert mirror.flush()
    [attempt] = store.get_run_history(run_id)
    assert (attempt.status, attempt.task_id, attempt.worker) == ("succeeded", step_id, "w1@host")
    assert store.get_step(step_id).status == "succeeded"
    mirror.close()


def test_of_two_reapers_one_retakes_an_unsent_claim(store: WorkflowStore) -> None:
    _, step_id = _claimed(store)
    time.sleep(0.01)
    [unsent] = store.reaping.unsent_claims(older_than=0)
    assert unsent.scheduled_at is not None
    won: list[bool] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def retake() -> None:
        barrier.wait()
        got = store.reaping.retake_claim(step_id, 1, unsent.scheduled_at)  # type: ignore[arg-type]
        with lock:
            won.append(got)

    reapers = [threading.Thread(target=retake) for _ in range(2)]
    for reaper in reapers:
        reaper.start()
    for reaper in reapers:
        reaper.join()
    assert sorted(won) == [False, True]
    assert store.reaping.unsent_claims(older_than=30) == []  # sent just now: its grace starts again


def test_the_journals_of_a_folder_tell_which_steps_still_wait_there(tmp_path: Path) -> None:
    live = Journal(tmp_path / "live.journal")  # held by a living process: read without its lock
    live.append("started", '{"step_id": "a", "id": "1"}')
    live.append("succeeded", '{"step_id": "b", "id": "2"}')
    assert journaled_steps(tmp_path, ["a", "c"]) == {"a"}
    assert journaled_steps(tmp_path / "nothing-here", ["a"]) == set()
    live.close()
