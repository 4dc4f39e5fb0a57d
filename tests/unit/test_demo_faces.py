"""The demo as a newcomer meets it: one broker variable, nothing made at import, and its
results and errors shown as ``runs show`` shows them."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.cli import commands as cli
from pikku_celery.render.text import format_history, format_run, format_runs
from tests.support import transitions

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_reads_the_broker_variable_the_demo_app_and_env_example_use(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIKKU_DEMO_BROKER_URL", "redis://example:6379/3")
    assert cli.build_parser().parse_args(["demo"]).broker_url == "redis://example:6379/3"
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[env: PIKKU_DEMO_BROKER_URL]" in text and "PIKKU_BROKER_URL" not in text
    assert "PIKKU_DEMO_BROKER_URL=" in (ROOT / ".env.example").read_text()
    assert "PIKKU_DEMO_BROKER_URL" in (ROOT / "pikku_celery" / "demo" / "app.py").read_text()


def _python(code: str, cwd: Path, tmp_path: Path) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PIKKU_DEMO_", "PIKKU_DATABASE_URL"))
    }
    env.update(
        PYTHONPATH=str(ROOT),
        PIKKU_JOURNAL_DIR=str(tmp_path / "journal"),
        PIKKU_DATABASE_URL=f"sqlite:///{tmp_path / 'demo.db'}",
    )
    subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, check=True, timeout=60)


def test_importing_the_demo_app_creates_nothing_until_its_broker_is_used(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    _python("import pikku_celery.demo.app", here, tmp_path)
    assert list(here.iterdir()) == []
    _python(
        "from pikku_celery.demo.app import app\n"
        "with app.connection_for_write() as connection:\n"
        "    connection.default_channel\n",
        here,
        tmp_path,
    )
    assert sorted(p.name for p in (here / ".pikku-demo").iterdir()) == ["control", "messages"]


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[WorkflowStore]:
    store = WorkflowStore(f"sqlite:///{tmp_path / 'faces.db'}")
    store.init()
    yield store
    store.close()


def test_results_are_json_in_the_demos_tables_as_in_runs_show(sqlite_store: WorkflowStore) -> None:
    store = sqlite_store
    run_id = store.create_run("checkout", {"order": 1})
    step = str(uuid.uuid4())
    transitions.schedule(store, run_id, "reserve", step_id=step, rpc_name="shop.reserve", data={})
    store.attempts.record_attempt(step, 1, "running", task_id=step)
    store.attempts.record_attempt(
        step, 1, "succeeded", result={"charged": 42.0, "ok": True, "n": None}
    )
    store.workflows.settle_workflow_run(
        run_id, "completed", from_statuses=("running",), output="order 1 shipped"
    )
    history = format_history(store.get_run_history(run_id))
    assert '{"charged": 42.0, "n": null, "ok": true}' in history
    assert "'charged'" not in history and "True" not in history
    runs = format_runs([store.get_run(run_id)])
    assert '"order 1 shipped"' in runs


def test_runs_show_prints_each_failed_attempts_traceback_under_it(
    sqlite_store: WorkflowStore,
) -> None:
    store = sqlite_store
    run_id = store.create_run("checkout", {})
    step = str(uuid.uuid4())
    transitions.schedule(store, run_id, "charge", step_id=step, rpc_name="shop.charge", data={})
    store.attempts.record_attempt(step, 1, "running", task_id=step)
    traceback = 'Traceback (most recent call last):\n  File "shop.py", line 9\nOSError: down\n'
    store.attempts.record_attempt(
        step, 1, "failed", error={"type": "OSError", "message": "down", "traceback": traceback}
    )
    store.attempts.record_attempt(step, 2, "scheduled", task_id=step, reason="retry")
    store.attempts.record_attempt(step, 2, "running", task_id=step)
    store.attempts.record_attempt(
        step, 2, "failed", error={"type": "ValueError", "message": "no tb"}
    )
    text = format_run(
        store.get_run(run_id), store.list_step_states(run_id), store.get_run_history(run_id)
    )
    errors = text.split("\n\nerrors\n")[1].splitlines()
    assert errors == [
        "charge #1: OSError: down",
        "    Traceback (most recent call last):",
        '      File "shop.py", line 9',
        "    OSError: down",
        "charge #2: ValueError: no tb",
    ]
