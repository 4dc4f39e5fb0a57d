"""The JSON API returns what the pages show, on SQLite and on PostgreSQL."""

from __future__ import annotations

from starlette.testclient import TestClient

from tests.dashboard.conftest import XSS, Seeded


def test_runs_filters_and_pages(client: TestClient, seeded: Seeded) -> None:
    body = client.get("/api/runs").json()
    assert [run["run_id"] for run in body["runs"]] == [
        seeded.running,
        seeded.completed,
        seeded.failed,
    ]
    assert (body["total"], body["limit"], body["offset"]) == (3, 50, 0)

    failed = client.get("/api/runs", params={"status": "failed"}).json()
    assert [run["run_id"] for run in failed["runs"]] == [seeded.failed]
    assert failed["runs"][0]["error"] == {
        "type": "ConnectionError",
        "message": XSS,
        "traceback": None,
        "stack": None,
    }
    assert failed["runs"][0]["input"] == {"order": 1, "note": XSS}

    several = client.get("/api/runs", params={"status": "failed,completed"}).json()
    assert several["total"] == 2 and several["status"] == ["failed", "completed"]

    page = client.get("/api/runs", params={"workflow": "checkout", "limit": 1, "offset": 1})
    assert [run["run_id"] for run in page.json()["runs"]] == [seeded.failed]
    assert page.json()["total"] == 2

    search = client.get("/api/runs", params={"q": seeded.running[:6]}).json()
    assert [run["run_id"] for run in search["runs"]] == [seeded.running]


def test_bad_parameters_are_a_400_with_a_message(client: TestClient, seeded: Seeded) -> None:
    bad = client.get("/api/runs", params={"status": "exploded"})
    assert bad.status_code == 400
    assert "use one of cancelled, completed, failed, running, suspended" in bad.json()["error"]
    assert client.get("/api/runs", params={"limit": 5000}).status_code == 400


def test_one_run_with_its_steps_and_attempts(client: TestClient, seeded: Seeded) -> None:
    body = client.get(f"/api/runs/{seeded.failed}").json()
    assert body["run"]["status"] == "failed"
    [step] = body["steps"]
    assert (step["step_name"], step["rpc_name"], step["status"], step["current_attempt"]) == (
        "charge",
        "shop.charge",
        "failed",
        3,
    )
    attempts = step["attempts"]
    assert [(a["attempt"], a["status"]) for a in attempts] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
    ]
    assert [a["reason"] for a in attempts][1:] == ["retry", "retry"]
    first = attempts[0]
    assert first["error"]["type"] == "ConnectionError"
    assert "Traceback" in first["error"]["traceback"]
    assert first["task_id"] == seeded.charge_step
    assert first["flower_url"] == f"http://flower.example:5555/task/{seeded.charge_step}"
    assert (first["worker"], first["pid"], first["delivery_count"]) == ("w1@host", 41, 1)
    assert first["running_at"] is not None and first["failed_at"] is not None
    assert first["duration_seconds"] >= 0


def test_an_unknown_run_is_a_json_404(client: TestClient, seeded: Seeded) -> None:
    missing = client.get("/api/runs/no-such-run")
    assert missing.status_code == 404
    assert "no-such-run" in missing.json()["error"]
