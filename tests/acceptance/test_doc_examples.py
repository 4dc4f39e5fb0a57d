"""The pages of the site whose examples start a server (a Celery worker, Flower, the
dashboard) run here, as written, with real processes: ``tests/docs/runner.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.conftest import address, port_open
from tests.conftest import PgServer, service_missing
from tests.docs.pages import Page, pages
from tests.docs.runner import BROKER_URL, run_page, starts_servers

WITH_SERVERS = [page for page in pages() if starts_servers(page)]


@pytest.mark.parametrize("page", WITH_SERVERS, ids=[p.name for p in WITH_SERVERS])
def test_the_page_runs_as_written_with_its_servers(
    page: Page, tmp_path: Path, pg_server: PgServer
) -> None:
    host, port = address(BROKER_URL)
    if not port_open(port, host):
        service_missing("Redis", ConnectionRefusedError(f"{host}:{port}"))
    run_page(page, tmp_path, pg_server.create_database)
