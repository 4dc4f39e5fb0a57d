"""The replay engine on the real store, with a dispatcher that records instead of sending.

Celery is not involved here: these tests are about what a replay reads, claims
and writes (the acceptance tests run the same engine on real workers).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.integration.task import WorkflowTask
from pikku_celery.workflows.definition import Workflow
from pikku_celery.workflows.replay import replay
from tests.conftest import truncate
from tests.support.durable import Recorder
from tests.support.statements import count_statements
from tests.support.threads import run_threads


class AddTask(WorkflowTask):
    name = "tests.add"


add = AddTask()


def start(store: WorkflowStore, workflow: Workflow, *args: Any) -> str:
    return store.create_run(
        workflow.name, {"args": list(args), "kwargs": {}}, graph_hash=workflow.version
    )


def long_workflow(steps: int) -> Workflow:
    def body(ctx: Any) -> int:
        return sum(ctx.do("add", add, n) for n in range(steps))

    return Workflow("long", body, "v1")


def finish_dispatched(store: WorkflowStore, recorder: Recorder, value: int = 1) -> None:
    """What a worker does with each dispatched step: run it, record success."""
    step_id, _, attempt = recorder.steps[-1]
    store.attempts.record_attempt(step_id, attempt, "running")
    store.attempts.record_attempt(step_id, attempt, "succeeded", result=value)


def test_a_replay_costs_the_same_however_many_steps_are_done(store: WorkflowStore) -> None:
    workflow = long_workflow(50)
    run_id = start(store, workflow)
    recorder = Recorder()
    per_replay: list[int] = []
    step_reads: list[int] = []
    for _ in range(50):
        with count_statements(store.engine) as log:
            assert replay(store, workflow, run_id, recorder) == "waiting"
        per_replay.append(len(log))
        step_reads.append(
            len(
                [
                    s
                    for s in log.statements
                    if "FROM workflow_step \n" in s or "FROM workflow_step\n" in s
                ]
            )
        )
        finish_dispatched(store, recorder)
    with count_statements(store.engine) as log:
        assert replay(store, workflow, run_id, recorder) == "completed"
    assert store.get_run(run_id).output == 50
    assert len(recorder.steps) == 50
    assert [name for _, name, _ in recorder.steps][:3] == ["add", "add#2", "add#3"]
    # Read the run, read all its steps once, claim the next one: the same few
    # statements for the 1st replay as for the 50th. Linear in 50, not quadratic.
    assert max(per_replay) == min(per_replay) <= 5, per_replay
    assert set(step_reads) == {1}
    assert len(log) <= 4


def test_concurrent_replays_dispatch_each_step_once(pg_engine: sa.Engine) -> None:
    truncate(pg_engine)  # real concurrency needs PostgreSQL: SQLite has one writer at a time
    store = WorkflowStore(pg_engine)
    workflow = long_workflow(5)
    run_id = start(store, workflow)
    recorder = Recorder()
    for _ in range(5):
        run_threads(6, lambda _: replay(store, workflow, run_id, recorder))
        finish_dispatched(store, recorder)
    assert replay(store, workflow, run_id, recorder) == "completed"
    names = [name for _, name, _ in recorder.steps]
    assert names == ["add", "add#2", "add#3", "add#4", "add#5"]  # each exactly once


def test_a_replay_of_a_settled_run_does_nothing(store: WorkflowStore) -> None:
    workflow = long_workflow(1)
    run_id = start(store, workflow)
    store.attempts.settle_run(run_id, "cancelled")
    recorder = Recorder()
    with count_statements(store.engine) as log:
        assert replay(store, workflow, run_id, recorder) == "settled"
    assert len(log) == 1
    assert recorder.steps == []


def test_a_recorded_step_asked_for_another_task_fails_the_run(store: WorkflowStore) -> None:
    class OtherTask(WorkflowTask):
        name = "tests.other"

    first = Workflow("flow", lambda ctx: ctx.do("step", add, 1), "v1")
    changed = Workflow("flow", lambda ctx: ctx.do("step", OtherTask(), 1), "v1")
    run_id = start(store, first)
    recorder = Recorder()
    replay(store, first, run_id, recorder)
    assert replay(store, changed, run_id, recorder) == "failed"
    error = store.get_run(run_id).error
    assert error is not None
    assert "'tests.add'" in error["message"] and "'tests.other'" in error["message"]


def test_inline_steps_run_once_and_state_is_written_once(store: WorkflowStore) -> None:
    calls: list[int] = []

    def body(ctx: Any) -> Any:
        def token_step() -> str:
            calls.append(1)
            return f"tok-{len(calls)}"

        token = ctx.do("token", token_step)
        ctx.state["token"] = token
        ctx.do("wait", add, 1)
        return token

    workflow = Workflow("inline", body, "v1")
    run_id = start(store, workflow)
    recorder = Recorder()
    assert replay(store, workflow, run_id, recorder) == "waiting"
    finish_dispatched(store, recorder)
    with count_statements(store.engine) as log:
        assert replay(store, workflow, run_id, recorder) == "completed"
    assert calls == [1]
    assert store.get_run(run_id).output == "tok-1"
    assert store.get_run_state(run_id) == {"token": "tok-1"}
    assert not [s for s in log.statements if "state" in s and s.startswith("UPDATE")]


def test_a_version_not_listed_as_compatible_fails_the_run(store: WorkflowStore) -> None:
    v1 = Workflow("flow", lambda ctx: ctx.do("step", add, 1), "v1")
    v2 = Workflow("flow", lambda ctx: ctx.do("step", add, 1), "v2")
    v3 = Workflow("flow", lambda ctx: 42, "v3", compatible=frozenset({"v1"}))
    run_id = start(store, v1)
    assert replay(store, v2, run_id, Recorder()) == "failed"
    error = store.get_run(run_id).error
    assert error is not None and error["code"] == "VERSION_CONFLICT"
    other = start(store, v1)
    assert replay(store, v3, other, Recorder()) == "completed"
