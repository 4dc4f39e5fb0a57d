"""A task's retry delay, as Celery holds it (seconds), on its step row: formatted once,
in the store; a delay no duration expresses is left out and the task runs as ever."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from pikku_celery import PikkuCelery, WorkflowTask
from pikku_celery.testing import InlineRunner


def test_a_tasks_delay_in_seconds_reaches_its_step_and_minus_one_fails_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery(f"delays_{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'd.db'}")

    def autoretrying(delay: float) -> dict[str, Any]:
        # Celery's own typing says whole seconds; Celery itself takes any number.
        return {
            "base": WorkflowTask,
            "autoretry_for": (ValueError,),
            "max_retries": 2,
            "default_retry_delay": delay,
            "shared": False,
        }

    @app.task(name="delays.declared", **autoretrying(0.25))
    def declared() -> str:
        return "declared"

    # Set by hand, past pikku.step's check: Celery takes it, no duration expresses it.
    @app.task(name="delays.negative", **autoretrying(-1))
    def negative() -> str:
        return "negative"

    try:
        with (
            InlineRunner(pikku) as runner,
            caplog.at_level(logging.WARNING, logger="pikku_celery"),
        ):
            fine, odd = runner.delay(declared), runner.delay(negative)
            assert (fine.status, fine.output) == ("completed", "declared")
            assert (odd.status, odd.output) == ("completed", "negative")
            [(fine_step, odd_step)] = zip(fine.steps, odd.steps, strict=True)
            step = runner.store.get_step_state(fine.run_id, fine_step)
            assert (step.retry_delay, step.retries) == ("250ms", 2)
            step = runner.store.get_step_state(odd.run_id, odd_step)
            assert (step.retry_delay, step.retries) == (None, 2)
        [warned] = [r for r in caplog.records if getattr(r, "action", "") == "retry_delay_left_out"]
        assert getattr(warned, "step_id", None) == odd.run_id
    finally:
        pikku.uninstall()
