"""The payload limit is a setting: ``pikku_max_payload_bytes`` / ``PIKKU_MAX_PAYLOAD_BYTES``.

A worker started with the environment variable keeps results under the limit it names,
and the error a larger result fails its task with names the setting to raise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import Celery

from pikku_celery import PikkuCelery
from pikku_celery.errors import ConfigurationError
from pikku_celery.integration.backend import ResultTooLarge
from tests.acceptance.conftest import Worker, worker_running
from tests.acceptance.results_loading import QUEUE, results_app

LIMIT = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def limited(
    pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ModuleType, Worker]]:
    tmp = tmp_path_factory.mktemp("payload-limit")
    with results_app(pg_url) as module:
        env = {"PIKKU_MAX_PAYLOAD_BYTES": str(LIMIT)}
        with worker_running(module, "redis", tmp, concurrency=1, queues=QUEUE, extra_env=env) as w:
            yield module, w


def test_the_environment_setting_sets_a_workers_result_limit(
    limited: tuple[ModuleType, Worker],
) -> None:
    app, worker = limited
    # 3 MiB: under the default 16 MiB, over the 2 MiB this worker was given.
    sent = app.huge.delay(3)
    error: Any = sent.get(timeout=60, propagate=False)
    assert isinstance(error, ResultTooLarge), error
    message = str(error)
    assert f"limit of {LIMIT}" in message
    # The message names the setting exactly as it is spelled, in both of its places.
    assert "pikku_max_payload_bytes setting" in message
    assert "app.conf.pikku_max_payload_bytes" in message
    assert "PIKKU_MAX_PAYLOAD_BYTES" in message
    [attempt] = worker.store.get_run_history(sent.id)
    assert attempt.status == "failed" and attempt.result is None
    # Under the limit: stored as ever.
    assert app.huge.delay(1).get(timeout=60) == "x" * 1024 * 1024


def test_the_app_setting_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIKKU_MAX_PAYLOAD_BYTES", "4096")
    app = Celery("limits", set_as_current=False)
    url = f"sqlite:///{tmp_path / 'pikku.db'}"
    assert _limit_of(app, url) == 4096
    app.conf.pikku_max_payload_bytes = 1000
    assert _limit_of(app, url) == 1000


def _limit_of(app: Celery, url: str) -> int:
    pikku = PikkuCelery(app, url)
    try:
        return pikku.store.codec.max_bytes
    finally:
        pikku.uninstall()
        pikku.mirror.close()
        pikku.store.close()


@pytest.mark.parametrize("value", ["16MiB", "0", "-1", True])
def test_a_limit_that_is_not_a_number_of_bytes_is_refused(tmp_path: Path, value: object) -> None:
    app = Celery("limits", set_as_current=False)
    app.conf.pikku_max_payload_bytes = value
    with pytest.raises(ConfigurationError, match="pikku_max_payload_bytes"):
        PikkuCelery(app, f"sqlite:///{tmp_path / 'pikku.db'}")
