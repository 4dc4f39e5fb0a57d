"""Chords finished by the pikku result backend itself, with real prefork workers: the
body runs once with the header's results in order, no ``celery.chord_unlock`` is ever
published, and a failed part fails the body with ``ChordError`` and runs its errbacks.

PostgreSQL and SQLite stores on Redis, and PostgreSQL on RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa
from celery import chain, chord, group
from celery.exceptions import ChordError

from pikku_celery import WorkflowStore
from tests.acceptance.conftest import Worker, worker_running
from tests.acceptance.results_loading import QUEUE, results_app


@pytest.fixture(
    scope="module",
    params=[("postgresql", "redis"), ("sqlite", "redis"), ("postgresql", "rabbitmq")],
    ids=lambda p: "-".join(p),
)
def results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ModuleType, Worker]]:
    database, broker = request.param
    tmp = tmp_path_factory.mktemp(f"chords-{database}-{broker}")
    if database == "postgresql":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp / 'results.db'}"
        WorkflowStore(url).init()
    with results_app(url, broker) as module:
        with worker_running(module, broker, tmp, concurrency=2, queues=QUEUE) as worker:
            yield module, worker


def fired_at(app: ModuleType, group_id: str) -> Any:
    with app.pikku.store.engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT fired_at FROM pikku_celery_result_chords WHERE group_id = :g"),
            {"g": group_id},
        ).scalar_one()


def test_a_chord_runs_its_body_once_with_the_results_in_header_order(
    results: tuple[ModuleType, Worker],
) -> None:
    app, worker = results
    sent: Any = chord([app.add.s(n, n) for n in range(10)], app.total.s()).apply_async()
    assert sent.get(timeout=60) == sum(2 * n for n in range(10))
    assert fired_at(app, sent.parent.id) is not None
    log = worker.log.read_text()
    assert "celery.chord_unlock" not in log
    assert log.count(f"results.total[{sent.id}] succeeded") == 1


def test_nested_groups_and_chains_in_a_header_count_by_their_last_tasks(
    results: tuple[ModuleType, Worker],
) -> None:
    app, _ = results
    header = [chain(app.add.s(1, 1), app.add.s(10)), app.add.s(3, 3)]
    assert chord(header, app.total.s()).apply_async().get(timeout=60) == 12 + 6
    flat: Any = chord(group(app.add.s(1, 1), app.add.s(2, 2)), app.total.s()).apply_async()
    assert flat.get(timeout=60) == 6


def test_a_failed_part_fails_the_body_with_chord_error_and_runs_its_errback(
    results: tuple[ModuleType, Worker],
) -> None:
    app, worker = results
    errback = app.failed_part.s()
    errback_id = errback.freeze().id
    body = app.total.s().on_error(errback)  # the body's errback, as Celery runs it
    sent: Any = chord([app.add.s(1, 1), app.refuse.s("gloves")], body).apply_async()
    # As with Celery's own backends, get() raises the header's own error, or the body's
    # ChordError when that is stored by the time get() looks...
    with pytest.raises((KeyError, ChordError), match="gloves"):
        sent.get(timeout=60)
    # ...and the body, which never ran, failed with ChordError naming the part.
    failed = app.app.AsyncResult(sent.id).get(timeout=60, propagate=False)
    assert isinstance(failed, ChordError) and "gloves" in str(failed)
    assert app.app.AsyncResult(sent.id).state == "FAILURE"
    assert app.app.AsyncResult(errback_id).get(timeout=60) == f"noted {sent.id}"
    assert f"results.total[{sent.id}] succeeded" not in worker.log.read_text()


def test_a_chord_of_two_hundred_parts_fires_once(results: tuple[ModuleType, Worker]) -> None:
    app, worker = results
    sent: Any = chord([app.plain_add.s(n, 1) for n in range(200)], app.total.s()).apply_async()
    assert sent.get(timeout=120) == sum(n + 1 for n in range(200))
    assert worker.log.read_text().count(f"results.total[{sent.id}] succeeded") == 1


def test_a_chord_in_a_run_ends_the_run_with_its_body_which_joins_that_run(
    results: tuple[ModuleType, Worker],
) -> None:
    app, worker = results
    run_id = app.pikku.run(
        chord([app.add.s(n, n) for n in range(3)], app.sum_step.s()), name="totals"
    )
    run = worker.wait_for_run(run_id, timeout=60)
    assert (run.status, run.output) == ("completed", 6)
    steps = {s.rpc_name: s.status for s in app.pikku.store.list_step_states(run_id)}
    assert steps == {"results.add": "succeeded", "results.sum_step": "succeeded"}
    # A body that is no step (a plain task under mirror="steps") holds nothing open.
    plain = app.pikku.run(chord([app.add.s(1, 1)], app.total.s()), name="plain body")
    assert worker.wait_for_run(plain, timeout=60).status == "completed"
