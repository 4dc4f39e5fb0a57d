"""Not collected on its own (no ``test_`` prefix): the session that test_interrupted.py runs
in a subprocess and interrupts while a worker fixture waits for its worker to be ready.

``INTERRUPTED_SITE`` is a folder with a ``sitecustomize.py`` that makes the worker's
interpreter stop before Celery starts: the fixture then waits until it is interrupted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.acceptance.conftest import ROOT, Worker, start_worker


@pytest.fixture
def stuck_worker(shop: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    # Not tmp_path: its teardown fails in a test interrupted before its report.
    tmp = tmp_path_factory.mktemp("stuck")
    site = os.environ["INTERRUPTED_SITE"]
    yield from start_worker(
        shop, "redis", tmp, extra_env={"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    )


def test_never_reached(stuck_worker: Worker) -> None:
    raise AssertionError("the worker was never to be ready")
