"""The HTML pages through the app, on SQLite and on PostgreSQL."""

from __future__ import annotations

import re
import uuid

from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.dashboard import create_app
from tests.dashboard.conftest import XSS, Seeded
from tests.support import transitions


def run_ids(html: str) -> list[str]:
    return re.findall(r'data-run-id="([^"]+)"', html)


def test_runs_page_lists_newest_first_and_filters(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert run_ids(page.text) == [seeded.running, seeded.completed, seeded.failed]
    assert "3 runs" in page.text
    assert run_ids(client.get("/?status=failed").text) == [seeded.failed]
    assert run_ids(client.get("/?workflow=checkout").text) == [seeded.completed, seeded.failed]
    both = client.get("/?workflow=checkout&status=completed").text
    assert run_ids(both) == [seeded.completed]
    assert '<option value="report">report</option>' in page.text


def test_runs_page_is_paginated(client: TestClient, seeded: Seeded) -> None:
    first = client.get("/?limit=2").text
    assert run_ids(first) == [seeded.running, seeded.completed]
    assert "page 1 of 2" in first
    assert 'href="/?limit=2&amp;offset=2"' in first and 'rel="prev"' not in first
    second = client.get("/?limit=2&offset=2").text
    assert run_ids(second) == [seeded.failed]
    assert 'href="/?limit=2"' in second and 'rel="next"' not in second


def test_search_by_run_id(client: TestClient, seeded: Seeded) -> None:
    exact = client.get(f"/?q={seeded.failed}", follow_redirects=False)
    assert exact.status_code == 303
    assert exact.headers["location"] == f"/runs/{seeded.failed}"
    prefix = client.get(f"/?q={seeded.completed[:8]}").text
    assert run_ids(prefix) == [seeded.completed]
    assert run_ids(client.get("/?q=no-such-run").text) == []
    assert "No runs match." in client.get("/?q=no-such-run").text


def test_refreshes_itself_only_while_a_listed_run_is_running(
    client: TestClient, seeded: Seeded
) -> None:
    refresh = '<meta http-equiv="refresh"'
    assert refresh in client.get("/").text
    assert refresh not in client.get("/?status=failed").text
    assert refresh in client.get(f"/runs/{seeded.running}").text
    assert refresh not in client.get(f"/runs/{seeded.failed}").text


def test_run_page_shows_steps_attempts_errors_and_the_timeline(
    client: TestClient, seeded: Seeded
) -> None:
    page = client.get(f"/runs/{seeded.failed}")
    assert page.status_code == 200
    html = page.text
    assert 'id="run-status">failed<' in html
    assert 'data-step="charge"' in html
    assert len(re.findall(r'<tr class="attempt" ', html)) == 3
    assert html.count('class="traceback"') >= 3
    assert "Traceback (most recent call last):" in html
    assert html.count('<g class="attempt"') == 3
    assert "w1@host" in html and "pid 41" in html
    assert "shop.charge" in html
    # Input, output, error and state of the run.
    assert "&#34;order&#34;: 1" in html
    assert "<h2>State</h2>" in html
    flower = f'href="http://flower.example:5555/task/{seeded.charge_step}"'
    assert html.count(flower) == 3


def test_no_flower_links_without_a_flower_url(store: WorkflowStore, seeded: Seeded) -> None:
    with TestClient(create_app(store)) as client:
        html = client.get(f"/runs/{seeded.failed}").text
    assert 'class="flower"' not in html
    assert seeded.charge_step[:8] in html


def test_unknown_run_and_bad_filters(client: TestClient, seeded: Seeded) -> None:
    assert client.get("/runs/no-such-run").status_code == 404
    bad = client.get("/?status=exploded")
    assert bad.status_code == 400
    assert "not a run status" in bad.text
    assert client.get("/?limit=0").status_code == 400
    assert client.get("/?offset=-1").status_code == 400
    assert client.get("/?limit=ten").status_code == 400


def test_a_run_id_with_any_characters_has_a_working_page(
    client: TestClient, store: WorkflowStore
) -> None:
    run_id = f"import/{uuid.uuid4().hex[:6]}?x=1#frag"
    store.create_run("odd ids", {}, run_id=run_id)
    listing = client.get("/").text
    href = re.search(r'class="run-link" href="([^"]+)"', listing)
    assert href is not None
    assert client.get(href.group(1).replace("&amp;", "&")).status_code == 200
    assert client.get(f"/api/runs/{href.group(1)[len('/runs/') :]}").json()["run"]["run_id"] == (
        run_id
    )


def test_user_data_is_escaped_everywhere(client: TestClient, store: WorkflowStore) -> None:
    evil = "<img src=x onerror=alert(1)>"
    run_id = store.create_run(f"wf{XSS}", {"x": XSS})
    step_id = str(uuid.uuid4())
    transitions.schedule(
        store, run_id, f"step{evil}", step_id=step_id, rpc_name=f"rpc{XSS}", data={"data": XSS}
    )
    store.attempts.record_attempt(step_id, 1, "running", worker=f"w{evil}")
    store.attempts.record_attempt(step_id, 1, "failed", error={"type": evil, "message": XSS})
    store.update_run_state(run_id, f"key{evil}", XSS)
    store.attempts.settle_run(run_id, "failed", {"type": evil, "message": XSS, "traceback": XSS})

    for path in ("/", f"/runs/{run_id}", f"/?workflow=wf{XSS}"):
        html = client.get(path, params=None).text
        assert "<script>" not in html, path
        assert "<img" not in html, path
    run_page = client.get(f"/runs/{run_id}").text
    assert "&lt;script&gt;alert(" in run_page
    assert "&lt;img src=x onerror=alert(1)&gt;" in run_page


def test_pages_send_security_headers(client: TestClient, seeded: Seeded) -> None:
    headers = client.get(f"/runs/{seeded.failed}").headers
    assert "script-src" not in headers["content-security-policy"]
    assert "default-src 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
