"""Markup in a step's name, error, result and branch, and in an event's name and data,
stays text in a real browser.

The HTML tests check the served bytes; this one checks what Chromium builds
from them, which is what an attacker's payload has to get past.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.dashboard import create_app
from tests.dashboard.conftest import PASSWORD

# The browser test's Chromium and its dashboard served by uvicorn over PostgreSQL.
from tests.dashboard.test_browser import CREDENTIALS
from tests.dashboard.test_browser import browser as browser
from tests.dashboard.test_browser import dashboard_url as dashboard_url
from tests.support import transitions

PAYLOAD = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">'
SECRET_INPUT = {"card": "4111-secret-card-number"}
EVENT_DATA = {"note": PAYLOAD}


@dataclass(frozen=True)
class EvilRun:
    run_id: str
    step_name: str
    error_summary: str
    event_name: str
    branch: str


@pytest.fixture
def evil_run(pg_url: str) -> Iterator[EvilRun]:
    """A completed run whose step failed once with the payload, then returned it; the
    payload is in the branch taken after that step and in an event sent to the run."""
    store = WorkflowStore(pg_url)
    run_id = store.create_run("escaping", SECRET_INPUT)
    try:
        step_id = str(uuid.uuid4())
        step_name = f"step {PAYLOAD}"
        transitions.schedule(store, run_id, step_name, step_id=step_id, data={})
        assert store.get_step_state(run_id, step_name).step_id == step_id
        store.attempts.record_attempt(step_id, 1, "running", task_id=step_id)
        store.attempts.record_attempt(
            step_id, 1, "failed", error={"type": "ValueError", "message": f"boom {PAYLOAD}"}
        )
        store.attempts.record_attempt(step_id, 2, "scheduled", task_id=step_id, reason="retry")
        store.attempts.record_attempt(step_id, 2, "running", task_id=step_id)
        store.attempts.record_attempt(step_id, 2, "succeeded", result=PAYLOAD)
        branch, event_name = f"branch {PAYLOAD}", f"event {PAYLOAD}"
        store.workflows.set_branch_taken(step_id, branch)
        store.workflows.send_event(run_id, event_name, EVENT_DATA)
        assert store.attempts.complete_run_if_done(run_id)
        yield EvilRun(run_id, step_name, f"ValueError: boom {PAYLOAD}", event_name, branch)
    finally:
        store.delete_run(run_id)
        store.close()


def assert_inert(page: Any) -> None:
    # The dashboard ships no script and no image, so any here came from the payload.
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("script").count() == 0
    assert page.locator("img").count() == 0


def test_the_probe_sees_markup_that_runs(browser: Any) -> None:
    """Guards the test below: unescaped, the payload does set the flag in this browser."""
    page = browser.new_page()
    try:
        page.set_content(PAYLOAD)
        page.wait_for_function("window.__pwned === 1", timeout=5000)
    finally:
        page.close()


# Bypassing the CSP shows the escaping holds on its own; enforcing it is what users get.
@pytest.mark.parametrize("bypass_csp", [True, False], ids=["csp-bypassed", "csp-enforced"])
def test_payloads_stay_text_on_the_run_and_runs_pages(
    browser: Any, dashboard_url: str, evil_run: EvilRun, bypass_csp: bool
) -> None:
    context = browser.new_context(bypass_csp=bypass_csp, http_credentials=CREDENTIALS)
    try:
        page = context.new_page()
        page.goto(f"{dashboard_url}/runs/{evil_run.run_id}")
        assert page.inner_text("#run-status") == "completed"
        assert_inert(page)

        step = page.locator("section.step")
        assert step.count() == 1
        assert step.get_attribute("data-step") == evil_run.step_name
        heading = step.locator("h3")
        assert heading.is_visible()
        assert evil_run.step_name in heading.inner_text()
        assert [
            page.locator("svg.timeline g.attempt").nth(i).get_attribute("data-step")
            for i in range(2)
        ] == [evil_run.step_name] * 2

        error = step.locator("tr.attempt-error details.error summary")
        assert error.count() == 1 and error.is_visible()
        assert error.inner_text() == evil_run.error_summary

        step.locator("details > summary", has_text="Result").click()
        result = step.locator("details[open] > pre")
        assert result.is_visible()
        assert result.inner_text() == json.dumps(PAYLOAD)
        branch = step.locator("dd.branch")
        assert branch.is_visible() and branch.inner_text() == evil_run.branch

        event = page.locator("table.events tr.event")
        assert event.count() == 1
        name = event.locator("td.event-name")
        assert name.is_visible() and name.inner_text() == evil_run.event_name
        assert event.locator("td.taken-by").inner_text() == "not taken yet"
        data = event.locator("pre.event-data")
        assert data.is_visible()
        assert data.inner_text() == json.dumps(EVENT_DATA, indent=2, ensure_ascii=False)
        assert_inert(page)

        page.goto(f"{dashboard_url}/")
        assert_inert(page)
        output = page.locator(f'tr.run[data-run-id="{evil_run.run_id}"] td code').last
        assert output.is_visible()
        assert output.inner_text() == PAYLOAD
    finally:
        context.close()


# --- reads behind the password ----------------------------------------------


def test_a_browser_without_the_right_password_sees_no_run_data(
    browser: Any, dashboard_url: str, evil_run: EvilRun
) -> None:
    paths = ("/", f"/runs/{evil_run.run_id}", f"/api/runs/{evil_run.run_id}")
    anonymous = browser.new_context()
    # Without credentials Chromium drops a challenged navigation with nothing to show, so
    # the page load is checked with a wrong password, as a person might type one.
    wrong = browser.new_context(http_credentials={"username": "anyone", "password": "guess"})
    try:
        for path in paths:
            response = anonymous.request.get(f"{dashboard_url}{path}")
            assert response.status == 401, path
            assert response.headers["www-authenticate"].startswith("Basic "), path
            assert "any user name" in response.text(), path
            assert SECRET_INPUT["card"] not in response.text(), path

        page = wrong.new_page()
        for path in paths:
            loaded = page.goto(f"{dashboard_url}{path}")
            assert loaded is not None and loaded.status == 401, path
            assert "Sign in" in page.inner_text("body"), path
            assert SECRET_INPUT["card"] not in page.content(), path
            assert evil_run.run_id not in page.content(), path

        # Open to monitoring: liveness and counts, neither naming a run.
        for path in ("/healthz", "/metrics"):
            response = anonymous.request.get(f"{dashboard_url}{path}")
            assert response.status == 200, path
            assert evil_run.run_id not in response.text(), path
    finally:
        anonymous.close()
        wrong.close()


# --- the same without a browser ---------------------------------------------


@pytest.fixture
def secured_run(store: WorkflowStore) -> Iterator[tuple[TestClient, str]]:
    run_id = store.create_run("escaping", SECRET_INPUT)
    with TestClient(create_app(store, auth_token=PASSWORD)) as client:
        yield client, run_id


def run_data_paths(run_id: str) -> list[str]:
    return [f"/runs/{run_id}", "/api/runs", f"/api/runs/{run_id}"]


def test_signed_in_reads_show_the_run_input(secured_run: tuple[TestClient, str]) -> None:
    """Guards the test below: the secret is there to leak on each of these paths."""
    client, run_id = secured_run
    for path in run_data_paths(run_id):
        response = client.get(path, auth=("anyone", PASSWORD))
        assert response.status_code == 200, path
        assert SECRET_INPUT["card"] in response.text, path


def test_with_a_password_anonymous_reads_of_run_data_are_refused(
    secured_run: tuple[TestClient, str],
) -> None:
    client, run_id = secured_run
    for path in run_data_paths(run_id):
        response = client.get(path)
        assert response.status_code == 401, path
        assert SECRET_INPUT["card"] not in response.text, path
