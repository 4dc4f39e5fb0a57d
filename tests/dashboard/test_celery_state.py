"""A step's state in Celery's result backend, beside its status, when the backend is this
store: ``runs show`` (text and ``--json``), the run page and ``/api/runs/{id}``."""

from __future__ import annotations

import json
import uuid

import pytest
from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.cli import commands as cli
from pikku_celery.cli import common as codes
from pikku_celery.dashboard import create_app
from pikku_celery.store import MirrorBatch, ResultWrite, now
from tests.support import transitions


def two_steps(store: WorkflowStore, *, with_results: bool) -> str:
    """A run whose ``charge`` succeeded and whose ``ship`` is still scheduled; with
    ``with_results``, Celery's backend holds SUCCESS for charge and nothing for ship."""
    run_id = store.create_run("checkout", {})
    charge, ship = str(uuid.uuid4()), str(uuid.uuid4())
    transitions.schedule(store, run_id, "charge", step_id=charge, rpc_name="shop.charge", data={})
    store.attempts.record_attempt(charge, 1, "running", task_id=charge, worker="w@h", pid=7)
    store.attempts.record_attempt(charge, 1, "succeeded", result=5)
    transitions.schedule(store, run_id, "ship", step_id=ship, rpc_name="shop.ship", data={})
    if with_results:
        row = ResultWrite(charge, 1, "SUCCESS", b'{"status": "SUCCESS", "result": 5}', now())
        store.batches.apply_batch(MirrorBatch(results=[row]))
    return run_id


def show(store: WorkflowStore, *args: str, capsys: pytest.CaptureFixture[str]) -> str:
    url = store.engine.url.render_as_string(hide_password=False)
    assert cli.main(["runs", "show", *args, "--database-url", url]) == codes.EXIT_OK
    return capsys.readouterr().out


def test_runs_show_puts_celerys_state_beside_the_history_when_results_are_here(
    store: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = two_steps(store, with_results=True)
    text = show(store, run_id, capsys=capsys)
    steps = text.split("\nsteps\n")[1].split("\n\n")[0].splitlines()
    assert steps[0].split()[:4] == ["step", "task", "status", "celery"]
    rows = {line.split()[0]: line.split() for line in steps[1:]}
    assert rows["charge"][2:4] == ["succeeded", "SUCCESS"]
    assert rows["ship"][2:4] == ["scheduled", "1"]  # no result: the column is empty

    document = json.loads(show(store, run_id, "--json", capsys=capsys))
    states = {s["step_name"]: s["celery_state"] for s in document["steps"]}
    assert states == {"charge": "SUCCESS", "ship": None}


def test_runs_show_has_no_celery_column_for_an_app_with_another_backend(
    store: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = two_steps(store, with_results=False)
    text = show(store, run_id, capsys=capsys)
    header = text.split("\nsteps\n")[1].splitlines()[0]
    assert "celery" not in header.split()


def test_the_run_page_and_its_api_show_celerys_state(store: WorkflowStore) -> None:
    run_id = two_steps(store, with_results=True)
    with TestClient(create_app(store)) as client:
        page = client.get(f"/runs/{run_id}")
        api = client.get(f"/api/runs/{run_id}").json()
    assert page.status_code == 200
    assert page.text.count('class="badge celery-state"') == 1
    assert "Celery: SUCCESS" in page.text
    assert {s["step_name"]: s["celery_state"] for s in api["steps"]} == {
        "charge": "SUCCESS",
        "ship": None,
    }
