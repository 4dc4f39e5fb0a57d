"""``/metrics`` computed from the database, and the exposition format's escaping."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.dashboard.metrics import escape_label, format_metrics
from pikku_celery.mirror.journal import HOSTED_SUFFIX, Journal, journal_folder
from pikku_celery.store.engine import safe_url
from pikku_celery.store.stats import AttemptTotals, OpenStepCounts
from tests.dashboard.conftest import Seeded
from tests.support import transitions


def samples(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return dict(line.rsplit(" ", 1) for line in lines)


def test_metrics_from_known_data(client: TestClient, seeded: Seeded) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    got = samples(response.text)
    assert {k: v for k, v in got.items() if k.startswith("pikku_runs")} == {
        'pikku_runs{status="cancelled"}': "0",
        'pikku_runs{status="completed"}': "1",
        'pikku_runs{status="failed"}': "1",
        'pikku_runs{status="running"}': "1",
        'pikku_runs{status="suspended"}': "0",
    }
    assert {k: v for k, v in got.items() if k.startswith("pikku_attempts")} == {
        # A step without an rpc name is counted under its step name.
        'pikku_attempts{step="build",status="running"}': "1",
        'pikku_attempts{step="shop.charge",status="failed"}': "3",
        'pikku_attempts{step="shop.reserve",status="succeeded"}': "1",
    }
    assert got["pikku_retry_attempts"] == "2"
    assert float(got["pikku_retry_ratio"]) == 2 / 5
    assert 0 <= float(got["pikku_oldest_running_attempt_age_seconds"]) < 60
    assert "# TYPE pikku_runs gauge" in response.text


def test_store_counts(store: WorkflowStore, seeded: Seeded) -> None:
    assert store.run_counts() == {"failed": 1, "completed": 1, "running": 1}
    assert store.attempt_totals() == AttemptTotals(attempts=5, retries=2)
    started = store.get_run_history(seeded.running)[0].running_at
    assert started is not None
    later = started + dt.timedelta(seconds=90)
    assert store.oldest_running_attempt_age(at=later) == 90.0
    assert store.workflow_names() == ["checkout", "report"]
    assert store.count_runs(workflow="checkout", status=["failed", "completed"]) == 2
    assert store.count_runs(run_id_prefix=seeded.failed) == 1


def test_an_empty_database(client: TestClient) -> None:
    got = samples(client.get("/metrics").text)
    assert got["pikku_retry_ratio"] == "0.0"
    assert got["pikku_oldest_running_attempt_age_seconds"] == "0.0"
    assert not [k for k in got if k.startswith("pikku_attempts")]


def test_label_values_are_escaped(client: TestClient, store: WorkflowStore) -> None:
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    run_id = store.create_run("wf", {})
    step_id = str(uuid.uuid4())
    transitions.schedule(store, run_id, "odd", step_id=step_id, rpc_name='say "hi"\\now\n', data={})
    assert 'pikku_attempts{step="say \\"hi\\"\\\\now\\n",status="scheduled"} 1' in (
        client.get("/metrics").text
    )


def test_format_is_one_sample_per_line() -> None:
    text = format_metrics(
        {"running": 2},
        [],
        AttemptTotals(attempts=4, retries=1),
        12.5,
        open_steps=OpenStepCounts(lost=3, running=5, stale_scheduled=7),
        stale_after=90.5,
    )
    assert text.endswith("\n")
    assert "pikku_retry_ratio 0.25\n" in text
    assert "pikku_oldest_running_attempt_age_seconds 12.5\n" in text
    assert 'pikku_runs{status="running"} 2\n' in text
    assert "pikku_celery_steps_lost 3\n" in text
    assert "pikku_celery_steps_scheduled_stale 7\n" in text
    assert "Steps scheduled over 90.5 seconds ago" in text


def test_journal_depth_counts_events_waiting_on_this_machine(
    client: TestClient, store: WorkflowStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIKKU_JOURNAL_DIR", str(tmp_path))
    assert samples(client.get("/metrics").text)["pikku_celery_journal_events"] == "0"
    folder = journal_folder(tmp_path, safe_url(store.engine.url))
    left = Journal(folder / "worker-1.journal")
    for n in range(3):
        left.append("started", json.dumps({"n": n}))
    other = Journal(journal_folder(tmp_path, "postgresql://elsewhere/db") / "w-2.journal")
    other.append("started", "{}")  # another database's journal is not this one's backlog
    try:
        assert samples(client.get("/metrics").text)["pikku_celery_journal_events"] == "3"
    finally:
        left.close()
        other.close()


def test_a_live_hosted_publishers_journal_nobody_writes_is_counted(
    client: TestClient, store: WorkflowStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIKKU_JOURNAL_DIR", str(tmp_path))
    assert samples(client.get("/metrics").text)["pikku_celery_journals_unserved"] == "0"
    folder = journal_folder(tmp_path, safe_url(store.engine.url))
    # A web app set to pikku_publisher_journal = "node", with no worker on its machine.
    publisher = Journal(folder / f"web-1{HOSTED_SUFFIX}", role="append")
    publisher.append("published", "{}")
    own = Journal(folder / "web-2.journal", role="append")  # not hosted: its own to write
    try:
        assert samples(client.get("/metrics").text)["pikku_celery_journals_unserved"] == "1"
        node = Journal(publisher.path, role="consume")  # a node's flusher claims it
        try:
            assert samples(client.get("/metrics").text)["pikku_celery_journals_unserved"] == "0"
        finally:
            node.close(delete_if_empty=False)
    finally:
        publisher.close()
        own.close()
    # Its publisher ended: any process adopts it now, so it is no deployment's mistake.
    assert samples(client.get("/metrics").text)["pikku_celery_journals_unserved"] == "0"
