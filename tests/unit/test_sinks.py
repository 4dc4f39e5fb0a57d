"""Each process role is one sink, chosen once; a task's result follows its attempt's end.

These run on SQLite in the test process: which sink a recorder or a result backend holds,
when it changes, and the order in which events reach the journal.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.errors import ConfigurationError
from pikku_celery.integration.backend import PikkuBackend
from pikku_celery.integration.result_sinks import Direct, Journaled
from pikku_celery.mirror import Recorder, result_stored
from pikku_celery.mirror.journal import HOSTED_SUFFIX
from pikku_celery.mirror.sinks import HostedSink, InlineSink, NodeSink, OwnSink
from tests.support.published import lone, own_journal


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[WorkflowStore]:
    store = WorkflowStore(f"sqlite:///{tmp_path / 'pikku.db'}")
    store.init()
    yield store
    store.close()


@pytest.fixture
def inline(sqlite: WorkflowStore, tmp_path: Path) -> Iterator[Recorder]:
    recorder = Recorder(sqlite, journal_dir=tmp_path / "inline", background=False)
    yield recorder
    recorder.close()


def kinds(recorder: Recorder) -> list[str]:
    return [entry.kind for entry in own_journal(recorder).peek(100, time.time() + 60)]


def test_a_recorder_chooses_its_sink_when_made_and_when_it_serves_a_node(
    sqlite: WorkflowStore, tmp_path: Path
) -> None:
    inline = Recorder(sqlite, journal_dir=tmp_path / "a", background=False)
    threaded = Recorder(sqlite, journal_dir=tmp_path / "b")
    try:
        assert type(inline.sink) is InlineSink
        assert type(threaded.sink) is OwnSink
        threaded.serve_node()
        node = threaded.sink
        assert type(node) is NodeSink
        threaded.serve_node()  # once: a second call changes nothing
        assert threaded.sink is node
    finally:
        inline.close()
        threaded.close()


def sink_type(recorder: Recorder) -> type:
    return type(recorder.sink)


def test_a_hosted_publisher_only_appends_until_it_serves_a_node_or_writes_its_own(
    sqlite: WorkflowStore, tmp_path: Path
) -> None:
    hosted = Recorder(sqlite, journal_dir=tmp_path / "a", publisher="node")
    serving = Recorder(sqlite, journal_dir=tmp_path / "b", publisher="node")
    asked = Recorder(sqlite, journal_dir=tmp_path / "c", publisher="node", background=False)
    own = Recorder(sqlite, journal_dir=tmp_path / "d")
    try:
        assert type(hosted.sink) is HostedSink
        hosted.published(lone("s-1"))
        names = [p.name for p in hosted.journal_folder.iterdir() if p.is_dir()]
        assert len(names) == 1 and names[0].endswith(HOSTED_SUFFIX)
        assert type(asked.sink) is InlineSink  # one that writes when asked writes its own
        serving.serve_node()  # a prefork worker's main process
        assert type(serving.sink) is NodeSink
        hosted.write_own_journal()  # a worker that forks no pool
        assert sink_type(hosted) is OwnSink
        sink = own.sink
        own.write_own_journal()  # it does already
        assert own.sink is sink
    finally:
        for recorder in (hosted, serving, asked, own):
            recorder.close()


def test_the_publisher_journal_comes_from_the_argument_the_app_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'pikku.db'}"

    def sink(conf: dict[str, str], publisher_journal: str | None = None) -> type:
        app = Celery("roles", broker="memory://", set_as_current=False)
        app.conf.update(conf)
        pikku = PikkuCelery(
            app,
            database_url=url,
            journal_dir=str(tmp_path / "j"),
            publisher_journal=publisher_journal,
        )
        try:
            return type(pikku.mirror.sink)
        finally:
            pikku.uninstall()
            pikku.mirror.close()

    assert sink({}) is OwnSink  # the default: safe wherever it runs
    assert sink({}, publisher_journal="node") is HostedSink
    assert sink({"pikku_publisher_journal": "node"}) is HostedSink
    monkeypatch.setenv("PIKKU_PUBLISHER_JOURNAL", "node")
    assert sink({}) is HostedSink
    assert sink({"pikku_publisher_journal": "own"}) is OwnSink
    with pytest.raises(ConfigurationError, match=r'"own".*"node".*not .shared.'):
        sink({}, publisher_journal="shared")


def test_a_redirected_recorder_writes_inline_to_the_other_store_then_goes_back(
    sqlite: WorkflowStore, tmp_path: Path
) -> None:
    other = WorkflowStore(f"sqlite:///{tmp_path / 'other.db'}")
    other.init()
    recorder = Recorder(sqlite, journal_dir=tmp_path / "usual")
    usual = recorder.sink
    try:
        with recorder.redirected(other, journal_dir=tmp_path / "other"):
            assert type(recorder.sink) is InlineSink
            recorder.published(lone("s-1"))
            assert recorder.flush()
            assert recorder.store is other
        assert recorder.sink is usual
        assert other.get_step("s-1").status == "scheduled"
        assert sqlite.runs.list_runs() == []  # nothing reached the usual store
    finally:
        recorder.close()
        other.close()


def test_a_result_stored_by_a_running_task_follows_its_attempts_end(inline: Recorder) -> None:
    inline.published(lone("s-1"))
    inline.started("s-1", 1, worker="w", pid=os.getpid())
    # Celery stores SUCCESS before it sends task_success.
    inline.result_after_attempt(result_stored("s-1", 1, "SUCCESS", b"{}", None))
    assert kinds(inline) == ["published", "started"]
    inline.succeeded("s-1", "s-1", 1, None)
    assert kinds(inline) == ["published", "started", "succeeded", "result"]
    assert inline.release("s-1")  # handed on by its end: nothing more goes
    assert kinds(inline) == ["published", "started", "succeeded", "result"]


def test_a_result_of_a_task_with_no_recorded_end_goes_when_the_task_has_run(
    inline: Recorder,
) -> None:
    inline.published(lone("other"))
    inline.result_after_attempt(result_stored("plain", 1, "SUCCESS", b"{}", None))
    inline.succeeded("other", "other", 1, None)  # another task's end
    assert kinds(inline) == ["published", "succeeded"]
    assert inline.release("plain")
    assert kinds(inline) == ["published", "succeeded", "result"]
    assert not inline.release("plain")  # once


def test_the_result_backend_writes_through_the_installed_recorder_or_straight_to_sql(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'pikku.db'}"
    WorkflowStore(url).init()
    app = Celery("sinks", broker="memory://", backend=f"pikku+{url}", set_as_current=False)
    backend = app.backend
    assert isinstance(backend, PikkuBackend)
    assert isinstance(backend._sink, Direct)  # no PikkuCelery on the app: no journal
    pikku = PikkuCelery(app, database_url=url, journal_dir=str(tmp_path / "journal"))
    try:
        assert isinstance(backend._sink, Journaled)
        assert backend.store is pikku.mirror.store
    finally:
        pikku.uninstall()
        pikku.mirror.close()
    assert isinstance(backend._sink, Direct)
