"""A durable workflow's step checks it did not succeed already before it runs; a database
outage must not turn that check into a failed step."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from celery import Celery

from pikku_celery import PikkuCelery
from pikku_celery.integration import headers as h


def test_a_workflow_step_runs_when_the_database_cannot_say_it_is_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("dup_check", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(
        app, database_url="postgresql://nobody@127.0.0.1:1/none", journal_dir=str(tmp_path)
    )
    calls: list[int] = []

    @pikku.step(name="dup_check.work")
    def work(x: int) -> int:
        calls.append(x)
        return x * 2

    with caplog.at_level(logging.WARNING, logger="pikku_celery.integration.task"):
        result = work.apply((21,), headers={h.ORCHESTRATED: True, h.RUN_ID: "run-1"})
    assert (result.state, result.result, calls) == ("SUCCESS", 42, [21])
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "duplicate_check_skipped"]
    assert "running it" in record.getMessage()
    pikku.uninstall()
