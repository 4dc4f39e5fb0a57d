"""With a password every page and API document needs it; /healthz and /metrics stay open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.dashboard import create_app
from tests.dashboard.conftest import PASSWORD, Seeded

SIGNED_IN = ("anyone", PASSWORD)
SECRET = {"card": "4111-secret-card-number"}


@pytest.fixture
def secured(store: WorkflowStore) -> Iterator[TestClient]:
    with TestClient(create_app(store, auth_token=PASSWORD)) as client:
        yield client


@pytest.fixture
def secret_run(store: WorkflowStore, seeded: Seeded) -> str:
    return store.create_run("secret", SECRET)


def reads(run_id: str) -> list[str]:
    return [
        "/",
        "/?status=running",
        f"/?q={run_id}",
        f"/runs/{run_id}",
        "/api/runs",
        f"/api/runs/{run_id}",
        "/login",
        # Paths that do not exist are refused the same way: nothing to learn from a 404.
        "/runs/no-such-run",
        "/api/no-such-thing",
        "/no-such-page",
    ]


def assert_challenged(response: Any, path: str) -> None:
    assert response.status_code == 401, path
    assert response.headers["www-authenticate"] == (
        'Basic realm="pikku-celery dashboard", charset="UTF-8"'
    ), path
    assert "any user name" in response.text and "PIKKU_DASHBOARD_PASSWORD" in response.text
    assert SECRET["card"] not in response.text, path


def test_every_read_needs_the_password(secured: TestClient, secret_run: str) -> None:
    for path in reads(secret_run):
        assert_challenged(secured.get(path), path)
        assert_challenged(secured.get(path, auth=("anyone", "wrong")), path)
    assert_challenged(secured.post(f"/runs/{secret_run}/delete", data={"csrf_token": "x"}), "post")


def test_signed_in_every_read_works(secured: TestClient, secret_run: str) -> None:
    for path in (f"/runs/{secret_run}", f"/api/runs/{secret_run}"):
        response = secured.get(path, auth=SIGNED_IN)
        assert response.status_code == 200, path
        assert SECRET["card"] in response.text, path
    assert secured.get("/", auth=SIGNED_IN).status_code == 200
    # Any user name will do; only the password is checked.
    assert secured.get("/api/runs", auth=("someone else", PASSWORD)).status_code == 200
    assert secured.get("/runs/no-such-run", auth=SIGNED_IN).status_code == 404


def test_healthz_and_metrics_stay_open_and_name_no_run(
    secured: TestClient, store: WorkflowStore, secret_run: str, seeded: Seeded
) -> None:
    health = secured.get("/healthz")
    assert (health.status_code, health.text) == (200, "ok\n")
    metrics = secured.get("/metrics")
    assert metrics.status_code == 200
    assert 'pikku_runs{status="running"} 2' in metrics.text
    for run_id in (secret_run, seeded.failed, seeded.completed, seeded.running, seeded.charge_step):
        assert run_id not in metrics.text
    assert SECRET["card"] not in metrics.text
    assert "order" not in metrics.text  # the seeded runs' input


def test_without_a_password_everything_reads_as_before(
    store: WorkflowStore, secret_run: str
) -> None:
    with TestClient(create_app(store)) as client:
        for path in ("/", f"/runs/{secret_run}", "/api/runs", f"/api/runs/{secret_run}"):
            response = client.get(path)
            assert response.status_code == 200, path
            assert "www-authenticate" not in response.headers, path
        assert "read-only" in client.get("/").text
        assert client.get("/healthz").status_code == 200
        refused = client.post(f"/runs/{secret_run}/delete")
        assert refused.status_code == 403 and "PIKKU_DASHBOARD_PASSWORD" in refused.text


def test_mounted_under_a_prefix_the_same_paths_are_open(
    store: WorkflowStore, secret_run: str
) -> None:
    parent = Starlette(routes=[Mount("/ops", app=create_app(store, auth_token=PASSWORD))])
    with TestClient(parent) as client:
        assert client.get("/ops/healthz").status_code == 200
        assert client.get("/ops/metrics").status_code == 200
        for path in ("/ops/", f"/ops/runs/{secret_run}", f"/ops/api/runs/{secret_run}"):
            assert_challenged(client.get(path), path)
        page = client.get(f"/ops/runs/{secret_run}", auth=SIGNED_IN)
        assert page.status_code == 200 and 'href="/ops/"' in page.text


def test_healthz_says_when_the_database_cannot_be_read() -> None:
    # Nothing listens on port 1.
    store = WorkflowStore("postgresql://nobody:hunter2@127.0.0.1:1/none")
    try:
        with TestClient(create_app(store, auth_token=PASSWORD)) as client:
            health = client.get("/healthz")
    finally:
        store.close()
    assert health.status_code == 503
    assert "database" in health.text
    # Whoever asks needs no password, so the answer names no server.
    assert "127.0.0.1" not in health.text and "nobody" not in health.text
