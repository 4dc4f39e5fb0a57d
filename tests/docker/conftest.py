"""pytest-celery's containers with a pikku worker: Redis and RabbitMQ brokers, PostgreSQL.

Needs a docker engine and the images (``docker/build-local-images.sh`` builds them all
without a registry; with one, the app image is built here and the others are pulled). No
engine: these tests skip locally and fail in CI, like every other missing service.
"""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_docker_tools.wrappers.container  # type: ignore[import-untyped]

from pikku_celery.testing.docker import (  # noqa: F401  (fixtures, found by their names)
    WORKER_IMAGE,
    PikkuPostgres,
    default_worker_container,
    default_worker_container_cls,
    default_worker_container_session_cls,
    default_worker_initial_content,
    engine_is_local,
    pikku_docker_app,
    pikku_docker_journal_volume,
    pikku_docker_postgres,
    pikku_docker_postgres_on_network,
    pikku_docker_store,
    pikku_docker_worker_command,
    pikku_docker_worker_env,
    pikku_docker_worker_files,
    pikku_docker_workers,
)
from tests.conftest import service_missing

ROOT = Path(__file__).resolve().parents[2]


def engine_socket_answers() -> None:
    """Connects to the engine's socket, and closes it: the docker client left a socket open
    when the engine was away (a ResourceWarning, which this suite turns into an error)."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    parts = urlsplit(host)
    if parts.scheme == "unix":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(parts.path)
    else:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 2375), 5).close()


@pytest.fixture(scope="session", autouse=True)
def docker_engine(request: pytest.FixtureRequest) -> Any:
    try:
        engine_socket_answers()
        client = request.getfixturevalue("docker_client")  # pytest-docker-tools' own
        client.ping()
    except Exception as exc:
        service_missing("the docker engine", exc)
    # pytest-docker-tools takes a /.dockerenv file as proof that the tests run inside a
    # container, and then reaches containers by their own address and port. Some machines
    # keep an empty marker at the root without being a container; when the engine is this
    # machine's own, its containers' ports are published here: reach them on localhost
    # (the container's port on localhost would be this machine's own Redis or RabbitMQ).
    marker = Path("/.dockerenv")
    if marker.is_file() and marker.stat().st_size == 0 and engine_is_local(client):
        pytest_docker_tools.wrappers.container.tests_inside_container = lambda: False
    if not client.images.list(name=WORKER_IMAGE):
        # With a registry: the default base image. Without one, build-local-images.sh first.
        built = subprocess.run(
            [
                "docker",
                "build",
                "-f",
                "docker/Dockerfile",
                "--target",
                "app",
                "-t",
                WORKER_IMAGE,
                ".",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode != 0:
            pytest.fail(
                f"could not build {WORKER_IMAGE}; without an image registry run "
                f"docker/build-local-images.sh first:\n{built.stderr[-3000:]}"
            )
    return client


@pytest.fixture
def celery_backend_cluster() -> None:
    """No result backend container: the tests read outcomes from the mirror, in SQL."""
    return None


@pytest.fixture(scope="session")
def pikku_docker_app_module(
    pikku_docker_postgres: PikkuPostgres,  # noqa: F811  (the fixture imported above, as a parameter)
    tmp_path_factory: pytest.TempPathFactory,
) -> ModuleType:
    # This process publishes too, and journals what it publishes: in a folder of the session's.
    # Both variables only while the module is imported: the suites after this one run without.
    os.environ["DOCKERAPP_JOURNAL_DIR"] = str(tmp_path_factory.mktemp("journal"))
    try:
        with pikku_docker_postgres.app_environment():
            module = importlib.import_module("tests.docker.dockerapp")
            module.setup_tables()
    finally:
        del os.environ["DOCKERAPP_JOURNAL_DIR"]
    return module
