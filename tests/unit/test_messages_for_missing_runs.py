"""A replay or a wake-up message whose run was deleted meanwhile: one line, and it is dropped.

The messages run through Celery's own worker code (the inline runner), which is what
would log a task's exception as "raised unexpected" with its traceback.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from pikku_celery import PikkuCelery
from pikku_celery.testing import InlineRunner
from pikku_celery.workflows.engine import ORCHESTRATE_TASK, WAKE_TASK

NOWHERE = "redis://127.0.0.1:9/0"


def test_messages_for_a_run_that_no_longer_exists_are_one_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery(f"gone_{uuid.uuid4().hex[:8]}", broker=NOWHERE, set_as_current=False)
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'gone.db'}")

    @pikku.workflow("napping")
    def napping(ctx: Any) -> str:
        ctx.sleep("nap", seconds=3600)
        return "rested"

    try:
        with InlineRunner(pikku) as runner:
            run = runner.start(napping)  # held at its sleep: the runner's clock stands
            assert run.status == "suspended"
            nap = run.steps["nap"].attempts[0]
            assert runner.store.delete_run(run.run_id)  # pruned while its wake-up waits
            with caplog.at_level(logging.INFO):
                app.send_task(ORCHESTRATE_TASK, (run.run_id,))
                app.send_task(WAKE_TASK, (run.run_id, nap.step_id, 1))
                runner.run_until_idle()
    finally:
        pikku.uninstall()
    dropped = [r for r in caplog.records if getattr(r, "action", None) == "message_for_missing_run"]
    assert [(r.levelno, r.exc_info) for r in dropped] == [(logging.WARNING, None)] * 2
    assert all(
        run.run_id in r.getMessage() and "no longer exists" in r.getMessage() for r in dropped
    )
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
