"""The data contract's advice for a Pikku service's ``search_path``, followed as written.

``docs/data-contract.md`` gives the SQL under ``<!-- advice: search_path -->``: a schema of
the service's own, then ``pikku_compat``. A service connected that way must make its own
tables in its schema (never in ``pikku_compat``, which pikku-celery's migrations own) and
read the four workflow tables through the views, JSON as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from tests.conftest import PgServer

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "data-contract.md"
MARKER = "<!-- advice: search_path -->"


def advised_statements() -> list[str]:
    text = CONTRACT.read_text(encoding="utf-8")
    [block] = re.findall(re.escape(MARKER) + r"\n```sql\n(.*?)```", text, flags=re.DOTALL)
    return [
        line.split("--")[0].strip().rstrip(";")
        for line in block.splitlines()
        if line.split("--")[0].strip()
    ]


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    url = pg_server.create_database()
    store = WorkflowStore(url)
    store.init()
    store.close()
    yield url


def test_a_pikku_service_on_the_advised_search_path(database: str) -> None:
    statements = advised_statements()
    [create_schema, set_path] = statements
    role = re.fullmatch(r"ALTER ROLE (\w+) SET search_path = (.+)", set_path)
    assert create_schema.startswith("CREATE SCHEMA ") and role, statements
    service, path = role.group(1), role.group(2)
    assert create_schema == f"CREATE SCHEMA {service}"

    store = WorkflowStore(database)
    try:
        run_id = store.create_run("checkout", {"order": 1})
        store.update_run_state(run_id, "receipt_id", "r-1")
        with store.engine.begin() as conn:
            conn.exec_driver_sql(create_schema)
        # The role's setting, given as the connection's own (roles are the whole server's):
        # what a service logging in as that role starts its sessions with.
        options = "-csearch_path=" + re.sub(r"\s+", "", path)
        engine = sa.create_engine(sa.make_url(database), connect_args={"options": options})
        try:
            with engine.begin() as conn:
                # What a Pikku service's own migrations do: tables named without a schema.
                conn.exec_driver_sql("CREATE TABLE channels (channel_id text PRIMARY KEY)")
                row = (
                    conn.exec_driver_sql(
                        "SELECT input, state, pg_typeof(input)::text AS kind "
                        "FROM workflow_runs WHERE workflow_run_id = %(r)s",
                        {"r": run_id},
                    )
                    .mappings()
                    .one()
                )
        finally:
            engine.dispose()
        with store.engine.connect() as conn:
            where = conn.exec_driver_sql(
                "SELECT table_schema FROM information_schema.tables WHERE table_name = 'channels'"
            ).all()
        assert where == [(service,)]  # not in pikku_compat, nor beside pikku-celery's tables
        # Through the views: JSON as text, which decodes to the values written.
        assert row["kind"] == "text"
        assert json.loads(row["input"]) == {"order": 1}
        assert json.loads(row["state"]) == {"receipt_id": "r-1"}
    finally:
        store.close()
