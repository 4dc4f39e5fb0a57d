"""A step's body runs under the request its tracer pushed, whatever Celery pyproject.toml
allows: before 5.5, outside a `celery worker` process (``apply()``, an embedded or inline
worker), Celery gave a task class with a ``__call__`` of its own an empty request instead."""

from __future__ import annotations

import uuid
from typing import Any

from celery import Celery

from pikku_celery import WorkflowTask


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
