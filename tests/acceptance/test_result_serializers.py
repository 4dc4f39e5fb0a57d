"""``backend="pikku://"`` with every result serializer Celery supports and with
``result_compression``: values and exceptions come back as Celery's own backends give
them, on both brokers, with real prefork workers and the PostgreSQL store.

The json, uncompressed case is ``test_result_backend``'s; here are the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa
from celery import group
from celery.backends import base

from tests.acceptance.conftest import Worker, worker_running
from tests.acceptance.results_loading import QUEUE, results_app

# What Celery puts before a compressed payload (no stub names it).
COMPRESSED_PAYLOAD_MAGIC: bytes = getattr(base, "COMPRESSED_PAYLOAD_MAGIC")  # noqa: B009

# (serializer, compression, broker): each serializer once, each compression Celery
# ships without extra packages once, RabbitMQ beside Redis.
CASES = [
    ("pickle", "bzip2", "rabbitmq"),
    ("msgpack", "zlib", "redis"),
    ("yaml", None, "rabbitmq"),
    ("json", "zlib", "redis"),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "-".join(map(str, case)))
def configured(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pg_url: str
) -> Iterator[tuple[ModuleType, Worker, str | None]]:
    serializer, compression, broker = request.param
    tmp = tmp_path_factory.mktemp(f"results-{serializer}")
    with results_app(pg_url, broker, serializer=serializer, compression=compression) as module:
        with worker_running(module, broker, tmp, concurrency=1, queues=QUEUE) as worker:
            yield module, worker, compression


def stored_meta(module: ModuleType, task_id: str) -> bytes:
    with module.pikku.store.engine.connect() as conn:
        meta = conn.execute(
            sa.text("SELECT meta FROM pikku_celery_results WHERE task_id = :id"), {"id": task_id}
        ).scalar_one()
    return bytes(meta)


def test_values_exceptions_and_groups_round_trip(
    configured: tuple[ModuleType, Worker, str | None],
) -> None:
    app, _, compression = configured
    sent = app.add.delay(2, 3)
    assert sent.get(timeout=30) == 5
    failed = app.refuse.delay("socks")
    with pytest.raises(KeyError, match="no socks"):
        failed.get(timeout=30)
    joined: Any = group(app.plain_add.s(n, n) for n in range(3)).apply_async()
    assert joined.get(timeout=30) == [0, 2, 4]
    # The row holds what the app's own settings made of the meta.
    meta = stored_meta(app, sent.id)
    assert meta.startswith(COMPRESSED_PAYLOAD_MAGIC) == (compression is not None)
    decoded = app.app.backend.decode(meta)
    assert decoded["result"] == 5 and decoded["status"] == "SUCCESS"


def test_a_value_only_pickle_carries_comes_back_whole_or_fails_the_task_plainly(
    configured: tuple[ModuleType, Worker, str | None],
) -> None:
    app, _, _ = configured
    sent = app.unusual.delay()
    if app.SERIALIZER == "pickle":
        assert sent.get(timeout=30) == frozenset({(1, "one"), (2, "two")})
        return
    # Another serializer cannot carry it: the task fails with the encoder's error, as
    # with Celery's own backends, instead of leaving a reader waiting.
    with pytest.raises(Exception) as caught:
        sent.get(timeout=30)
    assert sent.state == "FAILURE"
    assert "frozenset" in str(caught.value) or "serializ" in str(caught.value).lower()


def test_a_reader_with_another_compression_setting_reads_it(
    configured: tuple[ModuleType, Worker, str | None],
) -> None:
    app, _, _ = configured
    sent = app.add.delay(20, 22)
    assert sent.get(timeout=30) == 42
    # A result is read by what its payload says, not by the reader's setting.
    previous = app.app.conf.result_compression
    app.app.conf.result_compression = None
    try:
        backend = type(app.app.backend)(app.app, url="pikku://")
        assert backend.get_task_meta(sent.id)["result"] == 42
    finally:
        app.app.conf.result_compression = previous
