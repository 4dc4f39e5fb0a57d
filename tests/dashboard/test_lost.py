"""A step whose worker died shows as ``lost``: its own badge, its error, its own timeline color."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.dashboard.timeline import STATUS_COLORS
from tests.dashboard.conftest import LOST_ERROR, XSS, Seeded, lost_run

SVG = "{http://www.w3.org/2000/svg}"


def css_color(html: str, status: str) -> str:
    match = re.search(rf"\.status-{status}[^{{]*\{{ background: (#[0-9a-f]+); \}}", html)
    assert match, f"no badge color for {status}"
    return match.group(1)


def test_a_lost_step_and_attempt_have_their_own_badge_and_color(
    client: TestClient, store: WorkflowStore
) -> None:
    run_id, _ = lost_run(store)
    html = client.get(f"/runs/{run_id}").text
    assert 'id="run-status">running<' in html
    step = re.search(r'<section class="step" data-step="ship">.*?</section>', html, re.S)
    assert step is not None
    assert '<span class="badge status-lost">lost</span>' in step.group(0)
    assert '<tr class="attempt" data-attempt="1" data-status="lost">' in step.group(0)

    colors = {status: css_color(html, status) for status in ("lost", "failed", "running")}
    assert colors["lost"] == STATUS_COLORS["lost"]
    assert len(set(colors.values())) == 3
    assert len(set(STATUS_COLORS.values())) == len(STATUS_COLORS)


def test_a_lost_attempt_shows_its_error_like_a_failure_with_where_it_was_lost(
    client: TestClient, store: WorkflowStore
) -> None:
    run_id, _ = lost_run(store)
    html = client.get(f"/runs/{run_id}").text
    [error] = re.findall(r'<tr class="attempt-error">.*?</tr>', html, re.S)
    summary = re.search(r"<summary>(.*?)</summary>", error, re.S)
    assert summary is not None
    assert summary.group(1).startswith("pikku_celery.WorkerLost: Attempt 1 of step")
    assert "&lt;script&gt;" in summary.group(1) and XSS not in html
    assert 'class="facts lost"' in error
    assert "w9@host" in error and "pid 99" in error
    assert LOST_ERROR["lost_at"] in error
    assert "Redelivery</dt><dd>not expected" in error


def test_a_canvas_step_awaiting_its_redelivery_says_when_it_is_due_and_why(
    client: TestClient, store: WorkflowStore
) -> None:
    due = "2026-01-01T13:00:01+00:00"
    error = LOST_ERROR | {"redelivery_expected": True, "redelivery_due_at": due}
    run_id, _ = lost_run(store, error, wire={"type": "canvas"})
    html = client.get(f"/runs/{run_id}").text
    [block] = re.findall(r'<tr class="attempt-error">.*?</tr>', html, re.S)
    assert "Redelivery</dt><dd>expected" in block
    [when] = re.findall(r'<dd class="redelivery-due">(.*?)</dd>', block, re.S)
    assert due in when and "<code>visibility_timeout</code>" in when
    assert "cannot be dispatched again on its own" in when


def test_a_workflow_step_dispatched_again_says_so_instead_of_waiting(
    client: TestClient, store: WorkflowStore
) -> None:
    error = LOST_ERROR | {"redelivery_expected": True, "redispatched": True}
    run_id, _ = lost_run(store, error, wire={"type": "workflow"})
    html = client.get(f"/runs/{run_id}").text
    [block] = re.findall(r'<tr class="attempt-error">.*?</tr>', html, re.S)
    assert "Dispatched again</dt><dd>at once, under the same attempt" in block
    assert "redelivery-due" not in block


def test_the_timeline_draws_a_lost_attempt_in_its_color_up_to_when_it_was_lost(
    client: TestClient, store: WorkflowStore
) -> None:
    run_id, _ = lost_run(store)
    html = client.get(f"/runs/{run_id}").text
    svg = re.search(r"<svg .*?</svg>", html, re.S)
    assert svg is not None
    root = ET.fromstring(svg.group(0))
    [row] = root.findall(f"{SVG}g[@class='attempt']")
    assert row.get("data-status") == "lost"
    bar = row.find(f"{SVG}rect[@class='run status-lost']")
    assert bar is not None and bar.get("fill") == STATUS_COLORS["lost"]
    legend = root.find(f"{SVG}g[@class='legend']")
    assert legend is not None
    assert "lost" in [text.text for text in legend.findall(f"{SVG}text")]


def test_the_runs_list_marks_runs_with_a_lost_step(
    client: TestClient, store: WorkflowStore, seeded: Seeded
) -> None:
    run_id, _ = lost_run(store)
    html = client.get("/").text
    row = re.search(rf'<tr class="run" data-run-id="{run_id}".*?</tr>', html, re.S)
    assert row is not None
    assert '<span class="badge status-lost" title="steps lost with their worker">1 lost</span>' in (
        row.group(0)
    )
    # Only that run: the seeded ones have no lost step.
    assert html.count("1 lost</span>") == 1


def test_the_api_gives_the_lost_status_and_the_reapers_error(
    client: TestClient, store: WorkflowStore
) -> None:
    run_id, _ = lost_run(store)
    [step] = client.get(f"/api/runs/{run_id}").json()["steps"]
    assert step["status"] == "lost"
    [attempt] = step["attempts"]
    assert attempt["status"] == "lost"
    assert attempt["error"] == {**LOST_ERROR, "stack": None}
