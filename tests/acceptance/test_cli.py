"""The command line as a user runs it: a real subprocess on a real database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pikku_celery import WorkflowStore
from tests.acceptance.conftest import redis_db
from tests.conftest import PgServer


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pikku_celery", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_db_commands_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    missing = cli("--database-url", url, "db", "check")
    assert missing.returncode == 1
    assert f"no pikku-celery database at {tmp_path / 'cli.db'}" in missing.stderr
    assert "pikku-celery db upgrade" in missing.stderr
    assert not (tmp_path / "cli.db").exists()  # a check creates nothing
    (tmp_path / "cli.db").touch()  # an empty SQLite database: no schema yet
    behind = cli("--database-url", url, "db", "check")
    assert behind.returncode == 3
    assert "pikku-celery db upgrade" in behind.stderr
    up = cli("--database-url", url, "db", "upgrade")
    assert up.returncode == 0, up.stderr
    assert "Upgraded" in up.stdout
    again = cli("db", "upgrade", env={"PIKKU_DATABASE_URL": url})
    assert again.returncode == 0
    assert "already at revision" in again.stdout
    assert cli("--database-url", url, "db", "check").returncode == 0
    current = cli("--database-url", url, "db", "current")
    latest = WorkflowStore.latest_schema_revision()
    assert f"current: {latest}" in current.stdout


def test_db_upgrade_on_postgres_hides_the_password(pg_server: PgServer) -> None:
    url = pg_server.create_database("pikku_cli")
    assert cli("--database-url", url, "db", "upgrade").returncode == 0
    assert cli("--database-url", url, "db", "check").returncode == 0
    down = cli("--database-url", "postgresql://app:s3cret@127.0.0.1:1/none", "db", "upgrade")
    assert down.returncode == 1
    assert down.stderr.startswith("error: The workflow database")
    assert "s3cret" not in down.stderr
    assert "Traceback" not in down.stderr
    assert "check that it is running" in down.stderr


def test_demo_prints_the_runs_and_every_attempt(tmp_path: Path) -> None:
    result = cli("--database-url", f"sqlite:///{tmp_path / 'demo.db'}", "demo")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    charge = [line.split() for line in lines if line.startswith("charge")]
    assert [(row[1], row[2]) for row in charge] == [
        ("1", "failed"),
        ("2", "failed"),
        ("3", "succeeded"),
    ]
    assert any("completed" in line for line in lines)


def test_bad_url_is_one_clear_line() -> None:
    result = cli("--database-url", "mysql://x/y", "db", "upgrade")
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "use postgresql://" in result.stderr


def test_demo_on_redis_and_postgres(pg_server: PgServer) -> None:
    url = pg_server.create_database("pikku_demo")
    result = cli("demo", "--broker-url", redis_db(12), "--database-url", url)
    assert result.returncode == 0, result.stderr
    assert "refund" in result.stdout
    lines = result.stdout.splitlines()
    assert [line.split()[2] for line in lines if line.startswith("charge")] == [
        "failed",
        "failed",
        "succeeded",
    ]


def test_db_distribute_lays_the_tables_out_on_citus_or_says_what_to_do(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database("pikku_cli")
    assert cli("--database-url", url, "db", "upgrade").returncode == 0
    laid = cli("--database-url", url, "db", "distribute", "--shards", "4")
    if pg_server.citus:
        assert laid.returncode == 0, laid.stderr
        assert "Distributed on" in laid.stdout and "workflow_step_history" in laid.stdout
        again = cli("--database-url", url, "db", "distribute")
        assert again.returncode == 0, again.stderr
        assert "already distributed" in again.stdout
    else:
        assert laid.returncode == 1
        assert "no citus extension" in laid.stderr
        assert "CREATE EXTENSION citus" in laid.stderr
        assert "Traceback" not in laid.stderr
    sqlite_url = f"sqlite:///{tmp_path / 'x.db'}"
    assert cli("--database-url", sqlite_url, "db", "upgrade").returncode == 0
    sqlite = cli("--database-url", sqlite_url, "db", "distribute")
    assert sqlite.returncode == 1
    assert "Citus is PostgreSQL" in sqlite.stderr
