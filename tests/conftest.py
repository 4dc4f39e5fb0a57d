"""Shared fixtures: the real services, and a store on each database.

A service that is down skips its tests locally and fails them in CI
(``CI`` or ``PIKKU_REQUIRE_SERVICES`` set), so CI never counts a skip as a pass.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
import sqlalchemy as sa

from bench.citus import cluster as citus_cluster
from pikku_celery import WorkflowStore
from pikku_celery.store.engine import make_engine
from tests.support.redis_server import RedisServer

for _name in [
    name
    for name in os.environ
    if name.startswith("PIKKU_") and not name.startswith(("PIKKU_TEST_", "PIKKU_REQUIRE_"))
]:
    del os.environ[_name]


def _interrupted_by_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a CI timeout, ``docker stop``, ``kill``) ends the session as Ctrl-C does, so
    every fixture's teardown runs: workers stopped, test databases dropped. Further ones are
    ignored until that teardown is done (the sender's SIGKILL still ends it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


def pytest_sessionstart(session: pytest.Session) -> None:
    signal.signal(signal.SIGTERM, _interrupted_by_sigterm)


# pytest-xdist (`make test` runs the suite in two processes): the suite's users of Redis
# each take a database number of their own and flush it, so a second process gets a
# redis-server of its own rather than sharing the numbers. Set before any test module reads
# PIKKU_TEST_REDIS_URL.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_private_redis: RedisServer | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _private_redis
    if _XDIST_WORKER in ("", "gw0"):
        return
    _private_redis = RedisServer()
    _private_redis.start()
    os.environ["PIKKU_TEST_REDIS_URL"] = f"redis://127.0.0.1:{_private_redis.port}"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _private_redis is not None:
        _private_redis.stop()


# `make test` runs each test file's tests in one process (`--dist loadfile`), so a file's
# module-scoped workers start once. The files whose tests pytest-celery parametrizes:
_SORTED = ("tests/docker/",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _XDIST_WORKER:
        return
    # pytest-celery parametrizes its brokers in an order that differs between processes;
    # xdist needs every process to collect the same list.
    first: dict[Path, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.path, index)
    items.sort(
        key=lambda item: (
            first[item.path],
            item.nodeid if item.nodeid.startswith(_SORTED) else "",
        )
    )


REQUIRE_SERVICES = bool(os.environ.get("CI") or os.environ.get("PIKKU_REQUIRE_SERVICES"))
# A Citus coordinator (``python -m bench.citus start`` makes one with two workers): the
# suites' PostgreSQL databases are made on every node of the cluster and the store's tables
# distributed in them (``pikku-celery db distribute``), so the suites run on Citus.
CITUS_URL = os.environ.get("PIKKU_TEST_CITUS_URL")
PG_ADMIN_URL = CITUS_URL or os.environ.get(
    "PIKKU_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
# ``partitioned``: every PostgreSQL database the fixtures migrate is then laid out by day
# (``pikku-celery db upgrade --layout partitioned``), so a suite runs on that layout
# (``make test-partitioned``); unset or ``plain``: the tables as migrated.
TEST_LAYOUT = os.environ.get("PIKKU_TEST_LAYOUT", "plain")
if TEST_LAYOUT not in ("plain", "partitioned"):
    raise ValueError(f"PIKKU_TEST_LAYOUT is plain or partitioned, not {TEST_LAYOUT!r}")
TABLES = (
    "workflow_step_history",
    "workflow_step",
    "workflow_versions",
    "workflow_runs",
    "pikku_celery_leases",
    "pikku_celery_run_events",
    "pikku_celery_chords",
    "pikku_celery_deliveries",
    "pikku_celery_results",
    "pikku_celery_groups",
    "pikku_celery_result_chords",
    "pikku_celery_result_chord_parts",
)


def service_missing(what: str, exc: BaseException) -> None:
    message = f"{what} is not reachable ({exc}); start it, or unset CI to skip these tests"
    if REQUIRE_SERVICES:
        pytest.fail(message)
    pytest.skip(message)


class PgServer:
    """Makes throwaway databases on the test PostgreSQL server."""

    def __init__(self, admin_url: str, *, citus: bool = False) -> None:
        self.admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self.url = sa.make_url(admin_url)
        self.created: list[str] = []
        self.citus = citus

    def create_database(self, prefix: str = "pikku_test") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self.created.append(name)
        if self.citus:
            return citus_cluster.create_database(self._admin_url, name)
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        return self.url.set(database=name).render_as_string(hide_password=False)

    def distribute(self, url: str) -> None:
        """Lay the store's tables out in the database at ``url`` (migrated) as the suite
        runs them: distributed on Citus, partitioned by day with ``PIKKU_TEST_LAYOUT``."""
        if self.citus:
            store = WorkflowStore(url)
            try:
                store.distribute()
            finally:
                store.close()
        elif TEST_LAYOUT == "partitioned":
            store = WorkflowStore(url)
            try:
                store.partitions.convert()
            finally:
                store.close()

    def drop_all(self) -> None:
        for name in self.created:
            if self.citus:
                citus_cluster.drop_database(self._admin_url, name)
                continue
            with self.admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin.dispose()

    @property
    def _admin_url(self) -> str:
        return self.url.render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = PgServer(PG_ADMIN_URL, citus=CITUS_URL is not None)
    try:
        with server.admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as exc:
        service_missing("PostgreSQL", exc)
    yield server
    server.drop_all()


@pytest.fixture(scope="session")
def pg_url(pg_server: PgServer) -> str:
    """A database of this test session's own, at the latest schema."""
    url = pg_server.create_database()
    store = WorkflowStore(url)
    store.init()
    store.close()
    pg_server.distribute(url)
    return url


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(pg_url, pool_size=10)
    yield engine
    engine.dispose()


def truncate(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {', '.join(TABLES)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkflowStore]:
    """A migrated, empty store on each database: the contract suite runs on both."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("sqlite") / "pikku.db"
        sqlite_store = WorkflowStore(f"sqlite:///{path}")
        sqlite_store.init()
        yield sqlite_store
        sqlite_store.close()
    else:
        engine: sa.Engine = request.getfixturevalue("pg_engine")
        truncate(engine)
        yield WorkflowStore(engine)
