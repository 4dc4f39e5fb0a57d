"""A Citus cluster on this machine: a coordinator and its workers, one PostgreSQL cluster each.

Made with the Debian cluster tools (``pg_createcluster``, as root; the clusters belong to
the ``postgres`` user) from a PostgreSQL that has the citus extension installed; the
extension is loaded at start (``shared_preload_libraries``), created in the ``postgres``
database of every node, and the workers are added to the coordinator there. The
suites' Citus mode (``PIKKU_TEST_CITUS_URL``) reads the workers from that database.
Nothing here needs to survive a crash of the machine: ``fsync`` is off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from bench.harness.pg_tools import PgToolError, newest_postgres, run_tool

__all__ = ["CitusCluster", "ClusterError", "create_database", "drop_database", "node_urls"]

HOST = "127.0.0.1"
_PREFIX = "pikku_citus"
_TRUST = ("--", "--auth-local=trust", "--auth-host=trust")
_SETTINGS = (
    "shared_preload_libraries=citus",
    "fsync=off",
    "max_connections=300",
    # Citus commits a multi-shard write in two phases.
    "max_prepared_transactions=300",
    "wal_level=logical",
)


#: A step of making or dropping the cluster failed; the message says which, and how.
ClusterError = PgToolError


@dataclass(frozen=True)
class CitusCluster:
    """A coordinator on ``port`` and ``workers`` workers on the ports after it."""

    port: int = 9700
    workers: int = 2
    version: str = ""

    @property
    def names(self) -> list[str]:
        return [f"{_PREFIX}_coordinator"] + [
            f"{_PREFIX}_worker{n}" for n in range(1, self.workers + 1)
        ]

    @property
    def ports(self) -> list[int]:
        return [self.port + n for n in range(self.workers + 1)]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@{HOST}:{self.port}/{database}"

    def start(self) -> None:
        version = self.postgres_version()
        library = Path(run_tool("pg_config", "--pkglibdir").strip()) / "citus.so"
        if not library.exists():
            raise ClusterError(
                f"{library} is not there: install the citus extension for PostgreSQL {version} "
                "(Citus's packages, or its source built against this PostgreSQL) and start again"
            )
        for name, port in zip(self.names, self.ports, strict=True):
            options = [arg for setting in _SETTINGS for arg in ("-o", setting)]
            run_tool("pg_createcluster", version, name, "-p", str(port), *options, *_TRUST)
            run_tool("pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start")
        for port in self.ports:
            self._sql(port, "CREATE EXTENSION IF NOT EXISTS citus")
        self._sql(self.port, f"SELECT citus_set_coordinator_host('{HOST}', {self.port})")
        for port in self.ports[1:]:
            self._sql(self.port, f"SELECT citus_add_node('{HOST}', {port})")

    def stop(self) -> None:
        """Drop every node (stopped first); goes on past a failure, to drop the others."""
        version = self.postgres_version()
        problems = []
        for name in reversed(self.names):
            try:
                run_tool("pg_dropcluster", "--stop", version, name)
            except PgToolError as exc:
                if "does not exist" not in str(exc):
                    problems.append(str(exc))
        if problems:
            raise ClusterError("; ".join(problems))

    def postgres_version(self) -> str:
        return self.version or newest_postgres("pg_config")

    def _sql(self, port: int, statement: str) -> None:
        engine = sa.create_engine(
            f"postgresql+psycopg://postgres@{HOST}:{port}/postgres",
            isolation_level="AUTOCOMMIT",
            poolclass=sa.NullPool,
        )
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    with engine.connect() as conn:
                        conn.exec_driver_sql(statement)
                    return
                except sa.exc.OperationalError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            engine.dispose()


# --- databases on a running cluster ------------------------------------------------------


def _autocommit(url: sa.URL | str) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)


def node_urls(coordinator_url: str) -> list[sa.URL]:
    """The URL of every node of the cluster, with the coordinator's database and user: the
    coordinator first, then its workers as ``pg_dist_node`` lists them."""
    url = sa.make_url(coordinator_url)
    engine = _autocommit(url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT nodename, nodeport FROM pg_dist_node "
                "WHERE groupid <> 0 AND noderole = 'primary' ORDER BY nodeid"
            ).all()
    finally:
        engine.dispose()
    return [url] + [url.set(host=str(host), port=int(port)) for host, port in rows]


def create_database(coordinator_url: str, name: str) -> str:
    """Database ``name`` on every node, with the citus extension, its workers added on the
    coordinator: ready for ``pikku-celery db upgrade`` and ``db distribute``. Its URL."""
    nodes = node_urls(coordinator_url)
    for node in nodes:
        engine = _autocommit(node)
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        engine.dispose()
        engine = _autocommit(node.set(database=name))
        with engine.connect() as conn:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS citus")
        engine.dispose()
    coordinator = nodes[0].set(database=name)
    engine = _autocommit(coordinator)
    with engine.connect() as conn:
        conn.execute(
            sa.text("SELECT citus_set_coordinator_host(:host, :port)"),
            {"host": coordinator.host or HOST, "port": coordinator.port or 5432},
        )
        for node in nodes[1:]:
            conn.execute(
                sa.text("SELECT citus_add_node(:host, :port)"),
                {"host": node.host, "port": node.port},
            )
    engine.dispose()
    return coordinator.render_as_string(hide_password=False)


def drop_database(coordinator_url: str, name: str) -> None:
    """Database ``name`` dropped on every node (those holding it)."""
    for node in node_urls(coordinator_url):
        engine = _autocommit(node)
        with engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        engine.dispose()
