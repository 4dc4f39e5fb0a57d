"""Chords finished by the pikku result backend itself, with real prefork workers: the
body runs once with the header's results in order, no ``celery.chord_unlock`` is ever
published, and a failed part fails the body with ``ChordError`` and runs its errbacks.

PostgreSQL and SQLite stores on Redis, and PostgreSQL on RabbitMQ.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa
from celery import chain, chord, group
from celery.exceptions import ChordError

from pikku_celery import WorkflowStore
from tests.acceptance.conftest import Worker, wait_until, worker_running
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
    # As with Celery's own backends, get() raises the header's own error...
    with pytest.raises(KeyError, match="gloves"):
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


def test_a_failed_header_of_a_chord_applied_outside_a_run_ends_every_header_run(
    results: tuple[ModuleType, Worker],
) -> None:
    # From a web request: each header task is a run of its own, and the first one holds the
    # chord for its body. The second fails, so no body is ever sent: the held run must end.
    app, worker = results
    header = [app.add.s(2, 2), app.refuse.s("hats")]
    adding, refusing = (signature.freeze().id for signature in header)
    sent: Any = chord(header, app.sum_step.s()).apply_async()
    with pytest.raises((KeyError, ChordError), match="hats"):
        sent.get(timeout=60)
    assert worker.wait_for_run(refusing, timeout=60).status == "failed"
    held = worker.wait_for_run(adding, timeout=60)
    assert held.status == "failed"
    assert held.error is not None and held.error["type"] == "celery.exceptions.ChordError"
    assert refusing in held.error["message"] and sent.id in held.error["message"]
    # Its own success may still wait for its publish in the pool process's journal (the
    # header's publishes come from this process): it lands within a flush or two.
    wait_until(
        lambda: app.pikku.store.get_step(adding).status == "succeeded",
        timeout=10,
        what="the held header task's success",
    )


def test_a_body_lost_between_the_commit_and_its_publish_is_sent_again_by_the_reaper(
    pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The worker's main process writes its pool processes' journals, so it is the one
    # whose batch claims the chord: it is killed right after its COMMIT, before it sends
    # the body, and nobody else would ever send it.
    tmp = tmp_path_factory.mktemp("chord-lost-body")
    env = {"PIKKU_REAPER_INTERVAL": "1", "RESULTS_CHORD_RESEND_AFTER": "2"}
    crash = {**env, "PIKKU_TEST_CRASH_AT": "before_chord_send:batch"}
    with results_app(pg_url) as app:
        sent: Any = chord([app.add.s(1, 1), app.add.s(2, 2)], app.total.s()).apply_async()
        # In SQL before any part: the batch that writes the last part claims it.
        assert app.pikku.mirror.flush()
        with worker_running(
            app, "redis", tmp, concurrency=1, queues=QUEUE, extra_env=crash
        ) as first:
            wait_until(lambda: first.proc.poll() is not None, what="the crash point")
            assert first.proc.returncode == -signal.SIGKILL
            with contextlib.suppress(ProcessLookupError):
                first.kill_all()  # its pool process, left without its parent
        with worker_running(
            app, "redis", tmp, concurrency=1, queues=QUEUE, extra_env=env
        ) as second:
            assert sent.get(timeout=60) == 6
            log = second.log.read_text()
        # Read while the app's store is open: a connection made after it closed is left
        # for the garbage collector.
        assert fired_at(app, sent.parent.id) is not None
    assert f"sends the body of chord {sent.parent.id} again" in log
    both = first.log.read_text() + log
    assert both.count(f"results.total[{sent.id}] succeeded") == 1


def test_a_task_added_to_the_chord_by_a_header_task_is_in_the_bodys_results(
    results: tuple[ModuleType, Worker],
) -> None:
    app, worker = results
    sent: Any = chord([app.grow.s(3), app.add.s(1, 1)], app.total.s()).apply_async()
    assert sent.get(timeout=60) == 3 + 2 + 6  # the added add(3, 3) counted, last
    assert worker.log.read_text().count(f"results.total[{sent.id}] succeeded") == 1


@pytest.mark.parametrize("body", ["task", "chain"])
def test_get_raises_the_failed_header_tasks_own_error(
    results: tuple[ModuleType, Worker], body: str
) -> None:
    # Celery's get() looks at the parents once more after the body's result came (Redis's
    # wait does): the header's failure, in SQL before the body's ChordError, wins.
    app, _ = results
    for _attempt in range(5):
        tail = app.total.s() if body == "task" else chain(app.total.s(), app.identity.s())
        sent: Any = chord([app.refuse.s("scarves"), app.add.s(1, 1)], tail).apply_async()
        with pytest.raises(KeyError, match="no scarves"):
            sent.get(timeout=60)


def test_a_chain_in_the_header_failing_before_its_last_task_fails_the_body(
    results: tuple[ModuleType, Worker],
) -> None:
    # Celery stores the failure of the chain's later links, the last one a part of the chord:
    # the chord fires, its body fails with ChordError and its errback runs.
    app, _ = results
    errback = app.failed_part.s()
    errback_id = errback.freeze().id
    failing = chain(app.identity.si(42), app.refuse.si("boots"), app.identity.si(42))
    sent: Any = chord([failing, app.add.s(1, 1)], app.total.s().on_error(errback)).apply_async()
    with pytest.raises(KeyError, match="no boots"):
        sent.get(timeout=30)
    failed = app.app.AsyncResult(sent.id).get(timeout=30, propagate=False)
    assert isinstance(failed, ChordError) and "boots" in str(failed)
    assert app.app.AsyncResult(errback_id).get(timeout=30) == f"noted {sent.id}"


def test_a_chain_in_the_body_failing_before_its_last_task_fails_the_chord(
    results: tuple[ModuleType, Worker],
) -> None:
    app, _ = results
    failing = chain(app.identity.si(42), app.refuse.si("belts"), app.identity.si(42))
    # The lone header task ends after its chord is in SQL: a chord and its last part
    # committed at the same moment is another race, not this test's.
    header = app.identity.si(42).set(countdown=0.5)
    sent: Any = chord([header], failing).apply_async()
    with pytest.raises(KeyError, match="no belts"):
        sent.get(timeout=30)
    assert isinstance(app.app.AsyncResult(sent.id).get(timeout=30, propagate=False), KeyError)


def test_a_failed_task_in_a_nested_chain_of_the_header_fails_the_chord(
    results: tuple[ModuleType, Worker],
) -> None:
    # Celery's test_chord_unlock_with_failed_task_in_nested_chain_member: the chain's failed
    # first task must reach the body of the chord its group was uplifted to.
    app, _ = results
    nested = chain(
        group(
            app.identity.si(1),
            chain(
                app.refuse.si("hats"),
                group(app.identity.si(2), app.identity.si(3)),
                app.identity.si(4),
            ),
        ),
        app.identity.s(),
    )
    sent: Any = nested.apply_async()
    with pytest.raises((KeyError, ChordError), match="hats"):
        sent.get(timeout=30)
