"""The app factory: an explicit public surface, no connection until a request, clear failures."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import pikku_celery.dashboard as dashboard
from pikku_celery import WorkflowStore
from pikku_celery.dashboard import create_app
from pikku_celery.errors import ConfigurationError


def test_all_lists_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(dashboard).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(dashboard.__all__) == public - {"annotations"}
    assert dashboard.__all__ == sorted(dashboard.__all__)


def test_nothing_connects_until_a_request_and_a_dead_database_is_a_503() -> None:
    # Nothing listens on port 1: building the app must not notice, a request must say so.
    store = WorkflowStore("postgresql://nobody@127.0.0.1:1/none")
    try:
        app = create_app(store)
        with TestClient(app) as client:
            page = client.get("/")
            assert page.status_code == 503
            assert "cannot be reached" in page.text
            api = client.get("/api/runs")
            assert api.status_code == 503 and "cannot be reached" in api.json()["error"]
            assert client.get("/metrics").status_code == 503
    finally:
        store.close()


@pytest.mark.parametrize("url", ["javascript:alert(1)", "ftp://flower", "flower:5555"])
def test_a_flower_url_must_be_http(tmp_path: Path, url: str) -> None:
    store = WorkflowStore(f"sqlite:///{tmp_path / 'flower.db'}")
    try:
        with pytest.raises(ConfigurationError, match="http"):
            create_app(store, flower_url=url)
    finally:
        store.close()
