"""A hosted publisher only appends; a node's flusher of its machine writes its journal.

A publisher set to ``"node"`` (a web app) writes nothing itself: any node of its
database on the machine (a prefork worker's main process, ``pikku-celery flusher``)
claims its journal while it lives, one node at a time, and the next one takes over
when that node stops. A journal nobody consumes is said, counted, and loses nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.errors import RunNotFound
from pikku_celery.mirror import Recorder, unserved_journals
from pikku_celery.mirror.journal import HOSTED_SUFFIX
from pikku_celery.mirror.sinks import HostedSink
from tests.support.published import lone


def hosted(
    store: WorkflowStore,
    tmp_path: Path,
    *,
    adopt_interval: float = 2.0,
    flush_interval: float = 0.04,
) -> Recorder:
    return Recorder(
        store,
        journal_dir=tmp_path / "journal",
        publisher="node",
        adopt_interval=adopt_interval,
        flush_interval=flush_interval,
    )


def node(store: WorkflowStore, tmp_path: Path) -> Recorder:
    mirror = Recorder(store, journal_dir=tmp_path / "journal", background=False, adopt_interval=0)
    mirror.serve_node()
    return mirror


def publish(mirror: Recorder, count: int) -> list[str]:
    steps = [str(uuid.uuid4()) for _ in range(count)]
    for step_id in steps:
        mirror.published(lone(step_id))
    return steps


def statuses(store: WorkflowStore, steps: list[str]) -> list[str | None]:
    found: list[str | None] = []
    for step_id in steps:
        try:
            found.append(store.runs.get_run(step_id).status)
        except RunNotFound:
            found.append(None)
    return found


def hosted_journals(mirror: Recorder) -> list[str]:
    return sorted(p.name for p in mirror.journal_folder.glob(f"*{HOSTED_SUFFIX}"))


def unserved(mirror: Recorder) -> int:
    folder = mirror.journal_folder
    return unserved_journals(folder.parent, only=folder.name)


def test_a_node_writes_a_living_hosted_publishers_journal_and_deletes_it_once_it_ended(
    store: WorkflowStore, tmp_path: Path
) -> None:
    publisher = hosted(store, tmp_path)
    assert isinstance(publisher.sink, HostedSink)
    steps = publish(publisher, 3)
    assert len(hosted_journals(publisher)) == 1
    assert publisher.flush()  # nothing to do: it writes nothing itself
    assert statuses(store, steps) == [None] * 3
    assert publisher.stats().batches == 0

    flusher = node(store, tmp_path)
    try:
        assert flusher.flush()
        assert statuses(store, steps) == ["running"] * 3  # a lone task's run: scheduled step
        assert store.get_step(steps[0]).data == {"args": [1], "kwargs": {}}
        later = publish(publisher, 2)  # it keeps appending; the node keeps writing
        assert flusher.flush()
        assert statuses(store, later) == ["running"] * 2
        assert len(hosted_journals(publisher)) == 1  # its owner lives: it may append again
        publisher.close()
        assert flusher.flush()
        assert hosted_journals(publisher) == []
    finally:
        publisher.close()
        flusher.close()


def test_one_node_at_a_time_writes_a_hosted_journal_and_the_next_takes_it_over(
    store: WorkflowStore, tmp_path: Path
) -> None:
    publisher = hosted(store, tmp_path)
    first, second = node(store, tmp_path), node(store, tmp_path)
    try:
        steps = publish(publisher, 2)
        assert first.flush()
        assert second.flush()
        assert statuses(store, steps) == ["running"] * 2
        assert first.stats().written == 2
        assert second.stats().written == 0  # the first holds it
        first.close()  # a worker stops: the live publisher's journal is let go
        later = publish(publisher, 2)
        assert second.flush()
        assert statuses(store, later) == ["running"] * 2
        assert second.stats().written == 2
    finally:
        publisher.close()
        first.close()
        second.close()


def test_a_hosted_journal_nobody_writes_is_said_once_counted_and_written_later(
    store: WorkflowStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Looked at every 0.1 s here (twice the adoption interval); 4 s by default.
    publisher = hosted(store, tmp_path, adopt_interval=0.05, flush_interval=0.01)
    caplog.set_level(logging.INFO, logger="pikku_celery")
    try:
        steps = publish(publisher, 1)
        assert unserved(publisher) == 1  # the dashboard's gauge counts it at once
        for _ in range(3):
            time.sleep(0.15)
            steps += publish(publisher, 1)
        warnings = [r for r in caplog.records if getattr(r, "action", "") == "journal_unserved"]
        assert len(warnings) == 1  # once, not once per look
        message = warnings[0].getMessage()
        assert "pikku-celery flusher" in message and "PIKKU_PUBLISHER_JOURNAL" in message
        assert publisher.stats().unserved == 3
        assert statuses(store, steps) == [None] * 4

        flusher = node(store, tmp_path)  # a worker or `pikku-celery flusher` starts later
        try:
            assert flusher.flush()
            assert statuses(store, steps) == ["running"] * 4  # nothing was lost
            assert unserved(publisher) == 0
            time.sleep(0.15)
            steps += publish(publisher, 1)
            served = [r for r in caplog.records if getattr(r, "action", "") == "journal_served"]
            assert len(served) == 1
            assert publisher.stats().unserved == 3
            assert flusher.flush()
            assert statuses(store, steps) == ["running"] * 5
        finally:
            flusher.close()
    finally:
        publisher.close()
