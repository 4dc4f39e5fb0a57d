"""``/healthz`` is liveness (the database answers), ``/readyz`` readiness (its schema is this
version's, so the pages can be served): on a database pikku-celery never migrated, or one left
behind, ``/healthz`` is 200 and ``/readyz`` a 503 that says to run ``pikku-celery db upgrade``.

On real databases of the test's own, SQLite and PostgreSQL, with and without a password.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.dashboard import create_app
from pikku_celery.schema import migrate
from tests.conftest import PgServer
from tests.dashboard.conftest import PASSWORD


@pytest.fixture(params=["sqlite", "postgresql"])
def unmigrated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkflowStore]:
    """A database pikku-celery has never run on: it answers, it has no tables."""
    if request.param == "sqlite":
        (tmp_path / "empty.db").touch()
        url = f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        server: PgServer = request.getfixturevalue("pg_server")
        url = server.create_database("pikku_readyz")
    store = WorkflowStore(url)
    yield store
    store.close()


@pytest.mark.parametrize("password", [None, PASSWORD], ids=["open", "with a password"])
def test_an_unmigrated_database_is_alive_but_not_ready(
    unmigrated: WorkflowStore, password: str | None
) -> None:
    with TestClient(create_app(unmigrated, auth_token=password)) as client:
        assert client.get("/", auth=("any", PASSWORD)).status_code == 503  # as every page
        live = client.get("/healthz")
        assert (live.status_code, live.text) == (200, "ok\n")
        ready = client.get("/readyz")  # no credentials: monitors have none
        assert ready.status_code == 503
        latest = WorkflowStore.latest_schema_revision()
        assert ready.text == (
            f"not ready: the database schema is at none and this pikku-celery needs "
            f"{latest}; run `pikku-celery db upgrade`\n"
        )
        unmigrated.init()  # what `pikku-celery db upgrade` does
        ready = client.get("/readyz")
        assert (ready.status_code, ready.text) == (200, "ready\n")
        assert client.get("/", auth=("any", PASSWORD)).status_code == 200


def test_a_schema_left_behind_is_not_ready(unmigrated: WorkflowStore) -> None:
    migrate.upgrade(unmigrated.engine, "0001")
    with TestClient(create_app(unmigrated)) as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
    assert ready.status_code == 503
    assert "schema is at 0001" in ready.text and "run `pikku-celery db upgrade`" in ready.text


def test_a_database_that_cannot_be_read_is_neither_and_names_no_server() -> None:
    store = WorkflowStore("postgresql://nobody:hunter2@127.0.0.1:1/none")  # nothing listens
    try:
        with TestClient(create_app(store, auth_token=PASSWORD)) as client:
            answers = [client.get("/healthz"), client.get("/readyz")]
    finally:
        store.close()
    for answer in answers:
        assert answer.status_code == 503
        assert answer.text == (
            "unavailable: the database cannot be read; the dashboard's log says why\n"
        )


def test_under_a_prefix_readyz_is_open_too(store: WorkflowStore) -> None:
    parent = Starlette(routes=[Mount("/ops", app=create_app(store, auth_token=PASSWORD))])
    with TestClient(parent) as client:
        ready = client.get("/ops/readyz")
    assert (ready.status_code, ready.text) == (200, "ready\n")
