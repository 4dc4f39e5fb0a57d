"""An event the journal cannot take (a full disk) never fails the task or the publish: it
is lost, counted where an operator reads it, and logged."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.mirror import Recorder
from tests.support.published import lone


def test_an_event_the_journal_cannot_take_is_counted_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = WorkflowStore(f"sqlite:///{tmp_path / 'p.db'}")
    store.init()
    recorder = Recorder(store, journal_dir=tmp_path / "journal", background=False)

    def full(event: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(recorder.sink, "append", full)
    with caplog.at_level(logging.ERROR, logger="pikku_celery"):
        recorder.published(lone(str(uuid.uuid4())))
        recorder.published(lone(str(uuid.uuid4())))
    assert recorder.journal_failures == 2
    # Once a minute, not once per event: with the count, the cause and what to do.
    [line] = [r.getMessage() for r in caplog.records if "could not journal" in r.getMessage()]
    assert "No space left on device" in line and "PIKKU_JOURNAL_DIR" in line
    recorder.close()
    store.close()
