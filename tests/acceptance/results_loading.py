"""``results_app`` imported afresh for one configuration (its settings are read from the
environment when it is imported), and taken off again: each test module of the result
backend runs its own store, broker and serializer."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from tests.acceptance.conftest import BROKERS

MODULE = "tests.acceptance.results_app"
# Another id per test session: a queue no other session's worker consumes.
QUEUE = os.environ.get("RESULTS_QUEUE") or f"results-{os.getpid()}"
_SETTINGS = ("RESULTS_SERIALIZER", "RESULTS_COMPRESSION")


@contextmanager
def results_app(
    database_url: str,
    broker: str = "redis",
    *,
    serializer: str = "json",
    compression: str | None = None,
) -> Iterator[ModuleType]:
    """The app module with ``backend="pikku://"`` on ``database_url``; a worker started on it
    (``worker_running``) reads the same settings from the environment."""
    os.environ.update(
        RESULTS_DATABASE_URL=database_url,
        RESULTS_QUEUE=QUEUE,
        RESULTS_BROKER_URL=BROKERS[broker][0],
        RESULTS_SERIALIZER=serializer,
        RESULTS_COMPRESSION=compression or "",
    )
    # Imported again: a module imported once keeps the settings it was imported with.
    sys.modules.pop(MODULE, None)
    module = importlib.import_module(MODULE)
    try:
        yield module
    finally:
        for name in _SETTINGS:
            os.environ.pop(name, None)
        module.pikku.uninstall()
        module.pikku.mirror.close()
        module.pikku.store.close()
        module.app.close()
