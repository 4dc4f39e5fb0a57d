"""A step's result that is not JSON, inside a durable workflow: the run fails saying so.

The inline runner runs the task through Celery's own worker code and the mirror,
so the result reaches SQL as a real worker's would: as the mirror's placeholder.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from pikku_celery import PikkuCelery
from pikku_celery.mirror import unserialisable
from pikku_celery.testing import InlineRunner
from pikku_celery.workflows.definition import Workflow

NOWHERE = "redis://127.0.0.1:9/0"


class Opaque:
    def __repr__(self) -> str:
        return "<an opaque handle>"


class Flows:
    def __init__(self, database: Path) -> None:
        self.app = Celery(f"opaque_{uuid.uuid4().hex[:8]}", broker=NOWHERE, set_as_current=False)
        self.pikku = pikku = PikkuCelery(self.app, f"sqlite:///{database}")
        self.after: list[Any] = []

        # No result backend write: Celery itself would refuse the value otherwise, and
        # the mirror is what keeps it (as a placeholder).
        @pikku.step(ignore_result=True, shared=False)
        def handle() -> Opaque:
            return Opaque()

        @pikku.workflow("by-task")
        def by_task(ctx: Any) -> Any:
            value = ctx.do("handle", handle)
            self.after.append(value)  # the workflow must never see the placeholder
            return value

        @pikku.workflow("inline")
        def inline_flow(ctx: Any) -> Any:
            return ctx.do("handle", Opaque)

        self.by_task: Workflow = by_task
        self.inline: Workflow = inline_flow


@pytest.fixture
def flows(tmp_path: Path) -> Iterator[Flows]:
    flows = Flows(tmp_path / "opaque.db")
    yield flows
    flows.pikku.uninstall()


def test_a_tasks_result_that_is_not_json_fails_the_run_as_an_inline_steps_does(
    flows: Flows,
) -> None:
    with InlineRunner(flows.pikku) as runner:
        by_task = runner.start(flows.by_task)
        inline = runner.start(flows.inline)
        store = runner.store
        history = store.list_step_states(by_task.run_id)
    assert flows.after == []
    assert (by_task.status, inline.status) == ("failed", "failed")
    assert by_task.error is not None and inline.error is not None
    assert by_task.error["type"] == inline.error["type"] == "pikku_celery.errors.SerializationError"
    for message in (by_task.error["message"], inline.error["message"]):
        assert "The result of step 'handle' cannot be stored as JSON" in message
        assert "return JSON types (dict, list, str, int, float, bool, None)" in message
    # What to do about the task's: the step counts as done, so a rerun runs it again.
    assert f"pikku.rerun({by_task.run_id!r}, from_step='handle')" in by_task.error["message"]
    assert "<an opaque handle>" in by_task.error["message"]
    # The placeholder stays where it belongs: in the step's history.
    [step] = history
    assert step.status == "succeeded"
    assert step.result == unserialisable(Opaque())
