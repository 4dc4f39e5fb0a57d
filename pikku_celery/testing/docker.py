"""Your app's tasks and workflows in containers: pytest-celery with a pikku worker.

pytest-celery starts a broker container per test (Redis and RabbitMQ: each test runs on
both) and a worker container; this module makes that worker a real ``celery worker`` of
*your* app module, from an image with pikku-celery installed (``docker/Dockerfile``),
mirroring into a PostgreSQL container that the test reads back::

    # conftest.py
    import importlib
    pytest_plugins = ["pikku_celery.testing.docker"]

    @pytest.fixture(scope="session")
    def pikku_docker_app_module(pikku_docker_postgres):
        with pikku_docker_postgres.app_environment():   # this process's mirror: the container too
            return importlib.import_module("shop.tasks")

    # test_checkout.py
    def test_checkout(celery_setup, pikku_docker_app, pikku_docker_store):
        run_id = pikku_docker_app.checkout.start(order_id=1)
        assert wait_for_run(pikku_docker_store, run_id).status == "completed"

Images: ``PIKKU_TEST_WORKER_IMAGE`` (default ``pikku-celery:local``, as the compose file
builds it) and ``PIKKU_TEST_POSTGRES_IMAGE`` (default ``postgres:16-bookworm``). The app
module is copied into the worker as it is: it must import only what the image has
(pikku-celery, Celery, the standard library), or add files with ``pikku_docker_worker_files``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest
from pytest_celery import (  # type: ignore[import-untyped]
    DEFAULT_WORKER_CONTAINER_TIMEOUT,
    CeleryTestSetup,
    CeleryWorkerContainer,
)
from pytest_docker_tools import container, fxtr, volume  # type: ignore[import-untyped]

from pikku_celery.app import PikkuCelery
from pikku_celery.store import SETTLED_RUN_STATUSES, WorkflowRun, WorkflowStore

__all__ = [
    "JOURNAL_DIR",
    "PikkuPostgres",
    "PikkuWorkerContainer",
    "PikkuWorkers",
    "engine_is_local",
    "wait_for_run",
    "wait_until",
]

WORKER_IMAGE = os.environ.get("PIKKU_TEST_WORKER_IMAGE", "pikku-celery:local")
POSTGRES_IMAGE = os.environ.get("PIKKU_TEST_POSTGRES_IMAGE", "postgres:16-bookworm")
# Where the image's processes journal (docker/Dockerfile): a volume here outlives a container.
JOURNAL_DIR = "/var/lib/pikku-celery/journal"
# The name the worker containers reach the PostgreSQL container by, on each test's network.
POSTGRES_ALIAS = "pikku-postgres"


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {timeout}s")
        time.sleep(0.1)


def wait_for_run(store: WorkflowStore, run_id: str, timeout: float = 45) -> WorkflowRun:
    """The run once it has settled (completed, failed or cancelled), read from SQL."""
    found: list[WorkflowRun] = []

    def settled() -> bool:
        try:
            run = store.get_run(run_id)
        except LookupError:
            return False
        found[:] = [run]
        return run.status in SETTLED_RUN_STATUSES

    try:
        wait_until(settled, timeout, f"run {run_id} settled")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {found[0] if found else 'no run yet'}") from None
    return found[0]


def engine_is_local(client: Any) -> bool:
    """The docker engine runs on this machine (not: the tests run in a container beside it).

    Published ports are then on this machine's loopback, whatever marker files say.
    """
    try:
        name: str = client.info()["Name"]
    except Exception:
        return False
    return name == socket.gethostname()


class PikkuWorkerContainer(CeleryWorkerContainer):  # type: ignore[misc]
    """A ``celery worker`` of your app module in the pikku-celery image."""

    @classmethod
    def worker_name(cls) -> str:
        return "pikku_worker"

    @classmethod
    def worker_queue(cls) -> str:
        return "celery"

    @classmethod
    def image(cls) -> str:
        return WORKER_IMAGE

    @classmethod
    def pikku_command(cls, app_module: str, concurrency: int = 2) -> list[str]:
        # Gossip and mingle only slow the start of a worker that joins a test's cluster.
        return [
            "celery",
            "-A",
            app_module,
            "worker",
            f"--loglevel={cls.log_level()}",
            "-n",
            f"{cls.worker_name()}@%h",
            "-Q",
            cls.worker_queue(),
            "--pool=prefork",
            f"--concurrency={concurrency}",
            "--without-gossip",
            "--without-mingle",
        ]

    def kill(self) -> None:
        """``docker kill``: the worker and its pool children die at once, as a lost machine."""
        self._container.kill()
        self._container.wait(timeout=30)


@dataclass
class PikkuPostgres:
    """The PostgreSQL container the workers mirror into."""

    container: Any
    url: str  # from this test process (a published port on this machine)
    worker_url: str  # from the worker containers (by its alias on the test's network)

    def store(self) -> WorkflowStore:
        return WorkflowStore(self.url)

    @contextlib.contextmanager
    def app_environment(self) -> Iterator[None]:
        """``PIKKU_DATABASE_URL`` points at this container while your app module is imported
        (``PikkuCelery(app)`` reads it then), and is put back after."""
        before = os.environ.get("PIKKU_DATABASE_URL")
        os.environ["PIKKU_DATABASE_URL"] = self.url
        try:
            yield
        finally:
            if before is None:
                del os.environ["PIKKU_DATABASE_URL"]
            else:
                os.environ["PIKKU_DATABASE_URL"] = before


@dataclass
class PikkuWorkers:
    """More worker containers like the test's first one, started and removed by the test."""

    client: Any
    template: Any  # the first worker's container: its image, command, environment, network
    started: list[Any] = field(default_factory=list)

    def start(
        self, journal_volume: str | None = None, timeout: float = DEFAULT_WORKER_CONTAINER_TIMEOUT
    ) -> PikkuWorkerContainer:
        """A new container (a new host name: a new worker). ``journal_volume``: the named volume
        its journal lives on (a restarted machine keeps its disk); default: one of its own."""
        attrs = self.template.attrs
        volumes = {
            mount["Name"]: {"bind": mount["Destination"], "mode": "rw"}
            for mount in attrs["Mounts"]
            if mount["Type"] == "volume" and mount["Destination"] != JOURNAL_DIR
        }
        journal = journal_volume or self.client.volumes.create(f"pikku-journal-{uuid.uuid4()}").name
        volumes[journal] = {"bind": JOURNAL_DIR, "mode": "rw"}
        raw = self.client.containers.run(
            attrs["Config"]["Image"],
            command=attrs["Config"]["Cmd"],
            environment=attrs["Config"]["Env"],
            network=next(iter(attrs["NetworkSettings"]["Networks"])),
            volumes=volumes,
            detach=True,
        )
        worker = PikkuWorkerContainer(raw)
        self.started.append((raw, journal if journal_volume is None else None))
        wait_until(lambda: "ready." in worker.logs(), timeout, f"worker {raw.name} ready")
        return worker

    def remove(self, worker: PikkuWorkerContainer) -> None:
        """``docker rm -f``: the container is gone; a volume of its own is not."""
        worker._container.remove(force=True)

    def remove_all(self) -> None:
        for raw, own_volume in self.started:
            if self.client.containers.list(all=True, filters={"id": raw.id}):
                raw.remove(force=True)
            if own_volume:
                self.client.volumes.get(own_volume).remove(force=True)
        self.started.clear()


def _source_files(module: ModuleType) -> dict[str, bytes]:
    """The module's file, at the path its dotted name asks for (namespace packages above)."""
    path = module.__name__.replace(".", "/") + ".py"
    return {path: inspect.getsource(module).encode()}


@pytest.fixture(scope="session")
def pikku_docker_app_module() -> ModuleType:
    """Your app module: override this fixture (session-scoped, on pikku_docker_postgres)."""
    raise pytest.UsageError(
        "override the pikku_docker_app_module fixture in your conftest.py to return your app "
        "module, imported in `with pikku_docker_postgres.app_environment():` "
        "(see pikku_celery.testing.docker)"
    )


@pytest.fixture(scope="session")
def pikku_docker_postgres(docker_client: Any) -> Iterator[PikkuPostgres]:
    """One PostgreSQL container for the session, migrated. Import your app module in
    ``with pikku_docker_postgres.app_environment():`` so this process's mirror writes there too."""
    password = uuid.uuid4().hex
    raw = docker_client.containers.run(
        POSTGRES_IMAGE,
        environment={
            "POSTGRES_USER": "pikku",
            "POSTGRES_PASSWORD": password,
            "POSTGRES_DB": "pikku",
        },
        ports={"5432/tcp": ("127.0.0.1", None)},
        detach=True,
    )
    try:
        wait_until(lambda: bool(raw.reload() or raw.ports.get("5432/tcp")), 30, "PostgreSQL's port")
        port = raw.ports["5432/tcp"][0]["HostPort"]
        url = f"postgresql://pikku:{password}@127.0.0.1:{port}/pikku"
        store = WorkflowStore(url)

        def migrated() -> bool:
            try:
                store.init()
            except Exception:
                return False
            return True

        wait_until(migrated, 60, f"PostgreSQL in {POSTGRES_IMAGE} accepting the schema")
        store.close()
        yield PikkuPostgres(raw, url, f"postgresql://pikku:{password}@{POSTGRES_ALIAS}:5432/pikku")
    finally:
        raw.remove(force=True, v=True)


@pytest.fixture
def pikku_docker_postgres_on_network(
    pikku_docker_postgres: PikkuPostgres, docker_client: Any, default_pytest_celery_network: Any
) -> Iterator[PikkuPostgres]:
    """The PostgreSQL container joins this test's network, as ``pikku-postgres``."""
    network = docker_client.networks.get(default_pytest_celery_network.name)
    network.connect(pikku_docker_postgres.container, aliases=[POSTGRES_ALIAS])
    yield pikku_docker_postgres
    network.disconnect(pikku_docker_postgres.container, force=True)


@pytest.fixture(scope="session")
def pikku_docker_store(pikku_docker_postgres: PikkuPostgres) -> Iterator[WorkflowStore]:
    store = pikku_docker_postgres.store()
    yield store
    store.close()


@pytest.fixture
def pikku_docker_worker_files(pikku_docker_app_module: ModuleType) -> dict[str, bytes]:
    """What the worker's ``/app`` holds: your app module; override to add more files."""
    return _source_files(pikku_docker_app_module)


@pytest.fixture
def pikku_docker_worker_env(
    default_worker_env: dict[str, str], pikku_docker_postgres_on_network: PikkuPostgres
) -> dict[str, str]:
    return {**default_worker_env, "PIKKU_DATABASE_URL": pikku_docker_postgres_on_network.worker_url}


@pytest.fixture
def pikku_docker_worker_command(pikku_docker_app_module: ModuleType) -> list[str]:
    return PikkuWorkerContainer.pikku_command(pikku_docker_app_module.__name__)


@pytest.fixture
def default_worker_container_cls() -> type[PikkuWorkerContainer]:
    return PikkuWorkerContainer


@pytest.fixture(scope="session")
def default_worker_container_session_cls() -> type[PikkuWorkerContainer]:
    return PikkuWorkerContainer


@pytest.fixture
def default_worker_initial_content(pikku_docker_worker_files: dict[str, bytes]) -> dict[str, bytes]:
    return pikku_docker_worker_files


# Each test's journal on a volume of its own, as a deployment keeps it (docker/Dockerfile).
pikku_docker_journal_volume = volume()

default_worker_container = container(
    image=WORKER_IMAGE,
    environment=fxtr("pikku_docker_worker_env"),
    network="{default_pytest_celery_network.name}",
    volumes={
        "{default_worker_volume.name}": {"bind": "/app", "mode": "rw"},
        "{pikku_docker_journal_volume.name}": {"bind": JOURNAL_DIR, "mode": "rw"},
    },
    wrapper_class=PikkuWorkerContainer,
    timeout=DEFAULT_WORKER_CONTAINER_TIMEOUT,
    command=fxtr("pikku_docker_worker_command"),
)


def _pikku_of(module: ModuleType) -> PikkuCelery:
    for value in vars(module).values():
        if isinstance(value, PikkuCelery):
            return value
    raise pytest.UsageError(f"{module.__name__} has no PikkuCelery: make one at module level")


@pytest.fixture
def pikku_docker_app(
    celery_setup: CeleryTestSetup,
    pikku_docker_app_module: ModuleType,
    pikku_docker_postgres: PikkuPostgres,
) -> ModuleType:
    """Your app module, publishing to this test's broker container from this process."""
    app = _pikku_of(pikku_docker_app_module).app
    app.conf.update(broker_url=celery_setup.broker.config()["host_url"])
    # Drop pooled connections to the previous test's broker (Celery does the same after a fork).
    app._after_fork()  # type: ignore[attr-defined]  # Celery's own, untyped in its stubs
    return pikku_docker_app_module


@pytest.fixture
def pikku_docker_workers(
    celery_setup: CeleryTestSetup, docker_client: Any
) -> Iterator[PikkuWorkers]:
    workers = PikkuWorkers(docker_client, celery_setup.worker.container._container)
    yield workers
    workers.remove_all()
