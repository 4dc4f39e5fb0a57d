"""``backend="pikku://"``: Celery's own result API answered from the store, with real workers.

One prefork worker per store (PostgreSQL and SQLite), on Redis; the tasks are in
``results_app``. Every result is read back through ``AsyncResult`` as a user would,
and checked against the attempt rows the mirror wrote in the same transactions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import Celery, chain, group
from celery.exceptions import Reject
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult, GroupResult

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.errors import ConfigurationError, PayloadTooLarge
from pikku_celery.integration.backend import ResultTooLarge
from tests.acceptance.conftest import ROOT, Worker, worker_running
from tests.acceptance.results_loading import QUEUE, results_app
from tests.support.celery_release import since_celery


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ModuleType, Worker]]:
    tmp = tmp_path_factory.mktemp(f"results-{request.param}")
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp / 'results.db'}"
        WorkflowStore(url).init()
    with results_app(url) as module:
        with worker_running(module, "redis", tmp, concurrency=1, queues=QUEUE) as worker:
            yield module, worker


def test_get_returns_the_value_once_sql_shows_the_attempt_succeeded(
    results: tuple[ModuleType, Worker],
) -> None:
    app, worker = results
    sent = app.add.delay(2, 3)
    assert sent.get(timeout=20) == 5
    # Never before its attempt: the result is written after the attempt's end.
    [attempt] = worker.store.get_run_history(sent.id)
    assert (attempt.status, attempt.attempt) == ("succeeded", 1)
    fresh: Any = AsyncResult(sent.id, app=app.app)
    assert (fresh.state, fresh.successful(), fresh.ready()) == ("SUCCESS", True, True)
    assert fresh.date_done is not None
    # result_extended: what the request was, as Celery's own backends give it.
    assert (fresh.name, fresh.args, fresh.kwargs) == ("results.add", [2, 3], {})
    assert fresh.worker is not None and fresh.worker.startswith("shop-redis")
    assert fresh.retries == 0 and fresh.queue == QUEUE


def test_a_task_that_is_not_a_step_has_its_result_too(
    results: tuple[ModuleType, Worker],
) -> None:
    app, _ = results
    assert app.plain_add.delay(40, 2).get(timeout=20) == 42


def test_a_failure_comes_back_as_the_exception_it_was(
    results: tuple[ModuleType, Worker],
) -> None:
    app, worker = results
    sent = app.refuse.delay("socks")
    with pytest.raises(KeyError, match="no socks"):
        sent.get(timeout=20)
    assert sent.failed() and sent.state == "FAILURE"
    assert sent.traceback is not None and "no socks" in sent.traceback
    returned: Any = AsyncResult(sent.id, app=app.app).get(propagate=False)
    assert isinstance(returned, KeyError)
    [step] = worker.store.list_step_states(sent.id)
    assert step.status == "failed"


def test_retries_end_in_the_last_attempts_result(results: tuple[ModuleType, Worker]) -> None:
    app, _ = results
    sent = app.flaky.delay(2)
    assert sent.get(timeout=30) == "done after 2"
    assert sent.retries == 2


def test_a_custom_state_is_seen_while_the_task_runs_then_its_result(
    results: tuple[ModuleType, Worker],
) -> None:
    app, _ = results
    sent = app.progress.delay(2.0)
    deadline = time.monotonic() + 20
    while sent.state != "PROGRESS":
        assert time.monotonic() < deadline, sent.state
        time.sleep(0.02)
    assert sent.info == {"done": 1, "of": 2}
    assert sent.get(timeout=20) == "finished"
    assert sent.state == "SUCCESS"  # a late STARTED or PROGRESS never rewinds it


@since_celery("5.7", "AsyncResult has no exists()")
def test_unknown_ids_are_pending_and_forget_removes_a_result(
    results: tuple[ModuleType, Worker],
) -> None:
    app, _ = results
    unknown: Any = AsyncResult(str(uuid.uuid4()), app=app.app)
    assert unknown.state == "PENDING" and not unknown.exists()
    sent: Any = app.add.delay(1, 1)
    assert sent.get(timeout=20) == 2
    assert sent.exists()
    sent.forget()
    assert AsyncResult(sent.id, app=app.app).state == "PENDING"


def test_an_ignored_result_is_not_stored(results: tuple[ModuleType, Worker]) -> None:
    app, _ = results
    quiet = app.quiet.delay()
    # One worker process, one message at a time: once the next task is done, quiet ran.
    assert app.plain_add.delay(1, 2).get(timeout=20) == 3
    time.sleep(0.2)  # two flush intervals: a stored result would be in SQL by now
    assert AsyncResult(quiet.id, app=app.app).state == "PENDING"


def test_a_group_result_is_saved_restored_and_deleted(
    results: tuple[ModuleType, Worker],
) -> None:
    app, _ = results
    sent: Any = group(app.plain_add.s(n, n) for n in range(3)).apply_async()
    sent.save()
    restored: Any = GroupResult.restore(sent.id, app=app.app)
    assert restored is not None
    assert [r.id for r in restored.results] == [r.id for r in sent.results]
    assert restored.get(timeout=20) == [0, 2, 4]
    restored.delete()
    assert GroupResult.restore(sent.id, app=app.app) is None


def test_a_revoked_task_is_revoked(results: tuple[ModuleType, Worker]) -> None:
    app, _ = results
    sent = app.nap.delay(30)
    deadline = time.monotonic() + 20
    while sent.state != "STARTED":
        assert time.monotonic() < deadline, sent.state
        time.sleep(0.02)
    sent.revoke(terminate=True, signal="SIGKILL")
    deadline = time.monotonic() + 20
    while sent.state != "REVOKED":
        assert time.monotonic() < deadline, sent.state
        time.sleep(0.05)


def test_a_web_app_without_pikku_celery_reads_results(
    results: tuple[ModuleType, Worker], tmp_path: Path
) -> None:
    app, _ = results
    sent = app.add.delay(20, 22)
    assert sent.get(timeout=20) == 42
    url = app.pikku.store.engine.url.render_as_string(hide_password=False)
    reader = textwrap.dedent(
        f"""
        from celery import Celery
        app = Celery("web", backend={"pikku+" + url!r})
        print(app.AsyncResult({sent.id!r}).get(timeout=10))
        from pikku_celery.integration.installed import registry
        print(len(registry))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", reader],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["42", "0"]  # no PikkuCelery in the reading process


def test_a_backend_url_of_another_database_than_the_mirror_is_refused(tmp_path: Path) -> None:
    mirrored = f"sqlite:///{tmp_path / 'mirror.db'}"
    other = f"sqlite:///{tmp_path / 'other.db'}"
    app = Celery("mismatch", broker="memory://", backend=f"pikku+{other}", set_as_current=False)
    pikku = PikkuCelery(app, database_url=mirrored)
    try:
        with pytest.raises(ConfigurationError) as caught:
            app.backend.get_task_meta(str(uuid.uuid4()))
        message = str(caught.value)
        assert "other.db" in message and "mirror.db" in message and "pikku://" in message
    finally:
        pikku.uninstall()


def test_a_group_is_joined_natively_in_its_order_with_failures_in_place(
    results: tuple[ModuleType, Worker],
) -> None:
    app, _ = results
    assert app.app.backend.supports_native_join
    sent: Any = group(
        app.plain_add.s(1, 1), app.refuse.s("hats"), app.plain_add.s(2, 2)
    ).apply_async()
    values = sent.join_native(timeout=20, propagate=False)
    assert values[0] == 2 and values[2] == 4
    assert isinstance(values[1], KeyError)
    with pytest.raises(KeyError, match="no hats"):
        sent.get(timeout=20)


def test_waiting_for_a_result_that_does_not_come_times_out_as_celery_says(
    results: tuple[ModuleType, Worker],
) -> None:
    app, _ = results
    never: Any = AsyncResult(str(uuid.uuid4()), app=app.app)
    started = time.monotonic()
    with pytest.raises(CeleryTimeoutError):
        never.get(timeout=0.3)
    with pytest.raises(CeleryTimeoutError):
        GroupResult(str(uuid.uuid4()), [never], app=app.app).join_native(timeout=0.3)
    assert time.monotonic() - started < 5  # each wait ends at its timeout, not an interval later


def test_a_result_over_the_payload_limit_fails_the_task_saying_why(
    results: tuple[ModuleType, Worker],
) -> None:
    app, worker = results
    sent = app.huge.delay(17)
    error = sent.get(timeout=60, propagate=False)
    assert isinstance(error, ResultTooLarge) and isinstance(error, PayloadTooLarge)
    assert "max_payload_bytes" in str(error) and sent.id in str(error)
    assert sent.state == "FAILURE"
    # The step failed with the same words, and nothing of the large value was written.
    [attempt] = worker.store.get_run_history(sent.id)
    assert attempt.status == "failed" and attempt.result is None
    assert attempt.error is not None and "max_payload_bytes" in attempt.error["message"]
    assert app.huge.delay(1).get(timeout=60) == "x" * 1024 * 1024  # under it: as it was


@since_celery("5.7", "Reject(requeue=False) stores no result, so get() waits for ever")
def test_a_task_that_rejects_its_message_for_good_fails_at_once(
    results: tuple[ModuleType, Worker],
) -> None:
    # Celery's worker stores this FAILURE from its main process, where no task runs.
    app, _ = results
    sent = app.reject.delay()
    with pytest.raises(Reject, match="not for this queue"):
        sent.get(timeout=20)
    fresh: Any = AsyncResult(sent.id, app=app.app)
    assert (fresh.state, fresh.ready(), fresh.failed()) == ("FAILURE", True, True)


def test_the_links_after_a_failed_link_of_a_chain_fail_with_it(
    results: tuple[ModuleType, Worker],
) -> None:
    # Celery fails every later link for the failed one (Backend._fail_chain): the chain's
    # last link, the result a caller holds, is FAILURE as on Celery's own backends.
    app, _ = results
    sent: Any = chain(app.identity.si(1), app.refuse.si("laces"), app.identity.si(2)).delay()
    with pytest.raises(KeyError, match="no laces"):
        sent.get(timeout=20)
    last: Any = AsyncResult(sent.id, app=app.app)
    assert isinstance(last.get(timeout=20, propagate=False), KeyError)
    assert last.state == "FAILURE"


@since_celery("5.7", "a revoke stores no REVOKED, or stores it over any state")
@pytest.mark.parametrize("state", ["STARTED", "PROGRESS"])
def test_a_revoke_leaves_the_state_another_process_wrote(
    results: tuple[ModuleType, Worker], state: str
) -> None:
    # This process plays a worker elsewhere that started a task: the state it stored is in
    # SQL when store_result returns, so the worker told to revoke it leaves it alone.
    app, _ = results
    backend = app.app.backend
    started, not_started = str(uuid.uuid4()), str(uuid.uuid4())
    backend.store_result(started, {"hostname": "other@host"}, state)
    assert app.app.control.revoke([started, not_started], reply=True, timeout=10)
    assert backend.get_state(started) == state
    assert backend.get_state(not_started) == "REVOKED"
