"""The database away while tasks finish, with ``backend="pikku://"``: no task fails, no
result shows before it is in SQL, and every result is there once the database is back.

The worker reaches PostgreSQL through a proxy the test cuts (the shared server never
stops); the reading process (this one) reads the database directly, except in the test
of a reader whose own way to the database is cut.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import pytest
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult

from pikku_celery.mirror.journal import journal_depth
from tests.acceptance.conftest import wait_until, worker_running
from tests.acceptance.results_loading import QUEUE, results_app
from tests.acceptance.test_db_outage import proxied_database

TASKS = 20
# Long enough for a reader to look several times, short beside its timeout.
READER_OUTAGE_SECONDS = 4.0


@pytest.fixture
def loaded(pg_url: str) -> Iterator[ModuleType]:
    with results_app(pg_url) as module:
        yield module


def test_results_of_tasks_that_end_while_the_database_is_away_wait_and_then_arrive(
    loaded: ModuleType, pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("result-outage")
    with proxied_database(pg_url, tmp) as (proxy, env):
        spool = tmp / "spool"
        worker_env = {
            "RESULTS_DATABASE_URL": env["SHOP_DATABASE_URL"],
            "PIKKU_JOURNAL_DIR": str(spool),
        }
        with worker_running(
            loaded, "redis", tmp, concurrency=1, extra_env=worker_env, queues=QUEUE
        ) as worker:
            assert loaded.add.delay(0, 0).get(timeout=30) == 0  # all is well first
            proxy.cut()
            sent = [loaded.add.delay(n, n) for n in range(TASKS)]
            # Every task ran and ended: their events, results among them, wait on disk.
            wait_until(
                lambda: worker.log.read_text().count("succeeded in") >= TASKS + 1,
                what="the tasks to end while the database is away",
            )
            assert journal_depth(spool) > 0
            time.sleep(0.5)
            states = {AsyncResult(s.id, app=loaded.app).state for s in sent}
            assert states == {"PENDING"}, "a result was seen before it was in SQL"
            proxy.restore()
            values = [s.get(timeout=60) for s in sent]
            log = worker.log.read_text()

    assert values == [2 * n for n in range(TASKS)]
    for s in sent:
        fresh: Any = AsyncResult(s.id, app=loaded.app)
        assert fresh.state == "SUCCESS"
        [attempt] = worker.store.get_run_history(s.id)
        assert attempt.status == "succeeded"
    assert "raised unexpected" not in log and "Traceback" not in log


def test_a_result_journaled_by_a_process_killed_before_its_flush_arrives(
    loaded: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The pool process ends the task, journals its attempt and its result, and dies
    # before its flusher writes them: the journal is adopted and the result is there.
    tmp = tmp_path_factory.mktemp("result-killed")
    env = {"PIKKU_TEST_CRASH_AT": "after_result_journaled:results.add"}
    with worker_running(loaded, "redis", tmp, concurrency=1, extra_env=env, queues=QUEUE) as worker:
        # Its step's publish is in SQL before it runs (as almost always): Celery's main
        # process, told the pool process died, asks whether the success was stored.
        sent = loaded.add.apply_async((20, 22), countdown=1)
        assert sent.get(timeout=60) == 42
        wait_until(
            lambda: "SIGKILL" in worker.log.read_text(),
            what="the pool process to die where the test said",
        )
        # Celery's main process asked whether the success was stored before it would
        # record the lost process as a failure; the dead process's journal said it was.
        wait_until(
            lambda: "succeeded before the worker was lost" in worker.log.read_text(),
            what="the main process to find the success",
        )
    fresh: Any = AsyncResult(sent.id, app=loaded.app)
    assert fresh.state == "SUCCESS"
    [attempt] = worker.store.get_run_history(sent.id)
    assert attempt.status == "succeeded"


def test_a_reader_waits_through_a_short_outage_and_a_timeout_names_it(
    pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The reader (this process) reaches PostgreSQL through the proxy; the worker directly.
    tmp = tmp_path_factory.mktemp("reader-outage")
    with proxied_database(pg_url, tmp) as (proxy, env):
        with results_app(env["SHOP_DATABASE_URL"]) as app:
            worker_env = {"RESULTS_DATABASE_URL": pg_url, "PIKKU_JOURNAL_DIR": str(tmp / "w")}
            with (
                worker_running(
                    app, "redis", tmp, concurrency=1, extra_env=worker_env, queues=QUEUE
                ),
                ThreadPoolExecutor(2) as readers,
            ):
                assert app.plain_add.delay(1, 1).get(timeout=30) == 2  # all is well first
                napping = app.nap.delay(1.0)
                waiting = readers.submit(napping.get, timeout=60)
                proxy.cut()
                cut_at = time.monotonic()
                sent = app.plain_add.delay(2, 2)
                started_during = readers.submit(sent.get, timeout=60)
                # A reader whose own timeout ends first is told why nothing came.
                never: Any = AsyncResult(str(uuid.uuid4()), app=app.app)
                with pytest.raises(CeleryTimeoutError, match="database") as caught:
                    never.get(timeout=1)
                assert "check" in str(caught.value)
                time.sleep(max(0.0, READER_OUTAGE_SECONDS - (time.monotonic() - cut_at)))
                assert not waiting.done() and not started_during.done()
                proxy.restore()
                assert waiting.result(timeout=60) == "rested"
                assert started_during.result(timeout=60) == 4
