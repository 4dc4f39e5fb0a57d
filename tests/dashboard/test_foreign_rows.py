"""A run another tool wrote in its own forms shows on every page and in the API, as it is."""

from __future__ import annotations

import json

from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from tests.support.foreign import PIKKU_ERROR, insert_foreign_run


def test_the_runs_page_lists_a_foreign_run(client: TestClient, store: WorkflowStore) -> None:
    foreign = insert_foreign_run(store.engine)
    page = client.get("/")
    assert page.status_code == 200
    assert f'data-run-id="{foreign.run_id}"' in page.text
    assert "boom at the gateway" in page.text
    assert "2026-12-01 07:09:14" in page.text


def test_the_run_page_shows_a_foreign_run_with_its_values(
    client: TestClient, store: WorkflowStore
) -> None:
    foreign = insert_foreign_run(store.engine)
    page = client.get(f"/runs/{foreign.run_id}")
    assert page.status_code == 200
    assert "boom at the gateway" in page.text
    assert 'data-attempt="1" data-status="failed"' in page.text
    if store.dialect == "sqlite":
        # Pikku's error has a code and a stack, no type and no traceback: both shown.
        assert "RPC_NOT_FOUND: boom at the gateway" in page.text
        assert "at charge (charge.ts:3:9)" in page.text
        assert "receiptId" in page.text
    else:
        # A JSON string is shown as the string it is.
        assert "receiptId" in page.text and "order 1 shipped" in page.text


def test_the_api_gives_a_foreign_run_as_it_is(client: TestClient, store: WorkflowStore) -> None:
    foreign = insert_foreign_run(store.engine)
    listed = client.get("/api/runs")
    assert listed.status_code == 200
    assert [run["run_id"] for run in listed.json()["runs"]] == [foreign.run_id]
    answer = client.get(f"/api/runs/{foreign.run_id}")
    assert answer.status_code == 200
    document = answer.json()
    run = document["run"]
    assert (run["created_at"], run["updated_at"]) == (
        "2026-12-01T07:09:14+00:00",
        "2026-12-01T07:09:15.250000+00:00",
    )
    steps = {step["step_name"]: step for step in document["steps"]}
    assert (steps["charge"]["retry_delay"], steps["charge"]["retry_delay_seconds"]) == ("5s", 5.0)
    if store.dialect == "sqlite":
        assert (run["inline"], run["deterministic"]) == (True, False)
        assert run["output"] == "order 1 shipped"
        assert run["state"] == {"receiptId": "r-1"}
        assert run["error"] == PIKKU_ERROR
        assert steps["ship"]["result"] == "shipped"
    else:
        assert run["output"] == '"order 1 shipped"'
        assert run["state"] == '{"receiptId": "r-1"}'
        assert run["error"] == {"message": json.dumps(PIKKU_ERROR)}
