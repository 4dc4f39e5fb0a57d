"""End to end in headless Chromium: a real worker's retried run, seen on the dashboard."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import uvicorn

from pikku_celery import WorkflowStore
from pikku_celery.dashboard import create_app
from tests.acceptance.conftest import start_worker
from tests.conftest import REQUIRE_SERVICES
from tests.dashboard.conftest import PASSWORD
from tests.support.http import free_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("PIKKU_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
FLOWER = "http://flower.example:5555"
# What a person types into the browser's sign-in prompt; Playwright answers it.
CREDENTIALS = {"username": "anyone", "password": PASSWORD}

worker_running = contextmanager(start_worker)


def browser_missing(reason: str) -> None:
    message = f"{reason}; install it (apt-get install chromium), or unset CI to skip this test"
    if REQUIRE_SERVICES:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        browser_missing(f"Chromium is not at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        browser_missing(f"Playwright cannot be imported ({exc})")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def dashboard_url(pg_url: str) -> Iterator[str]:
    """The dashboard, behind its password, served by uvicorn over the PostgreSQL mirror."""
    store = WorkflowStore(pg_url)
    config = uvicorn.Config(
        create_app(store, flower_url=FLOWER, auth_token=PASSWORD),
        host="127.0.0.1",
        port=free_port(),
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        store.close()


def test_a_retried_run_in_the_browser(
    browser: Any, shop: ModuleType, tmp_path: Path, dashboard_url: str
) -> None:
    with worker_running(shop, "redis", tmp_path) as worker:
        result = shop.charge.delay({"order": 1}, fail_times=2)
        assert worker.wait_for_run(result.id).status == "completed"
        worker.wait_for_history(
            result.id,
            [("charge", 1, "failed"), ("charge", 2, "failed"), ("charge", 3, "succeeded")],
        )

    page = browser.new_page(viewport={"width": 1280, "height": 1000}, http_credentials=CREDENTIALS)
    try:
        page.goto(f"{dashboard_url}/")
        page.click(f'a.run-link[href="/runs/{result.id}"]')
        page.wait_for_url(f"{dashboard_url}/runs/{result.id}")
        assert page.inner_text("#run-status") == "completed"

        rows = page.locator("svg.timeline g.attempt")
        assert rows.count() == 3
        assert [rows.nth(i).get_attribute("data-status") for i in range(3)] == [
            "failed",
            "failed",
            "succeeded",
        ]
        assert page.locator("svg.timeline rect.run").count() == 3
        assert page.locator("svg.timeline rect.run").nth(2).get_attribute("fill") == "#2e9e5b"
        assert page.locator("tr.attempt").count() == 3
        assert page.locator("a.flower").first.get_attribute("href") == (
            f"{FLOWER}/task/{result.id}"
        )
        assert "gateway timeout" in page.inner_text("details.error summary >> nth=0")

        artifacts = ROOT / "artifacts"
        artifacts.mkdir(exist_ok=True)
        page.screenshot(path=str(artifacts / "dashboard-run.png"), full_page=True)
    finally:
        page.close()
