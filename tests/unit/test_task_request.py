"""A step's body runs under the request its tracer pushed, whatever Celery pyproject.toml
allows: before 5.5, outside a `celery worker` process (``apply()``, an embedded or inline
worker), Celery gave a task class with a ``__call__`` of its own an empty request instead."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from celery import Celery

from pikku_celery import PikkuCelery, WorkflowTask
from pikku_celery.testing import InlineRunner


def test_a_traced_step_sees_its_own_request_and_retries() -> None:
    app = Celery(f"request_{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=False)
    seen: list[tuple[str | None, int]] = []

    @app.task(base=WorkflowTask, bind=True, shared=False, max_retries=1, default_retry_delay=0)
    def flaky(self: Any) -> str:
        seen.append((self.request.id, self.request.retries))
        if self.request.retries == 0:
            raise self.retry()
        return "done"

    assert flaky.apply(task_id="step-1").get() == "done"
    assert seen == [("step-1", 0), ("step-1", 1)]


def test_each_attempt_ends_as_its_own_prerun_read_it(tmp_path: Path) -> None:
    """task_success records the attempt task_prerun read from that attempt's request; a
    task applied inside another ends as itself, not as the task around it."""
    app = Celery(f"attempts_{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'a.db'}")

    @app.task(name="attempts.inner", base=WorkflowTask, shared=False)
    def inner(x: int) -> int:
        return x * 2

    @app.task(
        name="attempts.outer",
        base=WorkflowTask,
        bind=True,
        shared=False,
        max_retries=1,
        default_retry_delay=0,
    )
    def outer(self: Any) -> int:
        if self.request.retries == 0:
            raise self.retry()
        value: int = inner.apply(args=(21,)).get()
        return value

    try:
        with InlineRunner(pikku) as runner:
            run = runner.delay(outer)
            assert (run.status, run.output) == ("completed", 42)
            [name] = run.steps
            step = runner.store.get_step_state(run.run_id, name)
            assert (step.status, step.attempt_count, step.result) == ("succeeded", 2, 42)
    finally:
        pikku.uninstall()
