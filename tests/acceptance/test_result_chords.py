"""Chords finished by the pikku result backend itself, with real prefork workers: the
body runs once with the header's results in order, no ``celery.chord_unlock`` is ever
published, and a failed part fails the body with ``ChordError`` and runs its errbacks.

PostgreSQL and SQLite stores on Redis, and PostgreSQL on RabbitMQ.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa
from celery import chain, chord, group
from celery.exceptions import ChordError, CPendingDeprecationWarning

from pikku_celery import WorkflowStore
from pikku_celery.store import FiredChord
from tests.acceptance.conftest import Worker, wait_until, worker_running
from tests.acceptance.results_loading import QUEUE, results_app
from tests.support.celery_release import since_celery


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


@contextlib.contextmanager
def worker_of_its_own(app: ModuleType, tmp: Path, env: dict[str, str]) -> Iterator[Worker]:
    """A worker of the test's own settings, on a queue of its own: the module's worker, on
    the shared one, takes none of its tasks."""
    queue = f"{QUEUE}-own"
    app.app.conf.task_default_queue = queue
    with worker_running(
        app, "redis", tmp, concurrency=2, queues=queue, extra_env={"RESULTS_QUEUE": queue, **env}
    ) as worker:
        yield worker


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


def test_a_group_at_the_end_of_a_chain_in_a_header_gives_the_body_a_list(
    results: tuple[ModuleType, Worker],
) -> None:
    # As Celery's Redis backend joins such a header: the chain's group is one value.
    app, _ = results
    tail = chain(app.identity.s(42), group(app.identity.s(), app.identity.s()))
    assert chord(group(tail), app.identity.s()).delay().get(timeout=60) == [[42, 42]]
    sevens = chain(app.identity.s(7), group(app.identity.s(), app.identity.s()))
    mixed = chord([app.add.s(1, 1), sevens, app.add.s(2, 2)], app.identity.s())
    assert mixed.delay().get(timeout=60) == [2, [7, 7], 4]


def test_a_body_is_sent_by_a_header_task_under_its_root(
    results: tuple[ModuleType, Worker],
) -> None:
    # As Celery's own backends send it: from the header task that completed the chord.
    app, _ = results
    first = app.ids.si()
    root = first.freeze().id
    sent: Any = chain(first, app.ids.si(), chord([app.ids.si(), app.ids.si()], app.ids.s()))()
    body = sent.get(timeout=60)
    header = [r.id for r in sent.parent.results]
    assert body["root"] == root
    assert body["parent"] in header
    assert [part["root"] for part in body["given"]] == [root, root]
    # A chord of its own: the header tasks are roots, and the body follows one of them.
    lone: Any = chord([app.ids.si(), app.ids.si()], app.ids.s()).apply_async()
    body = lone.get(timeout=60)
    assert body["parent"] in [r.id for r in lone.parent.results]
    assert body["root"] == body["parent"]
    # Sent by a task: that task's root is the chord's.
    outer: Any = app.chord_of_ids.delay()
    body = app.app.AsyncResult(outer.get(timeout=60)).get(timeout=60)
    assert body["root"] == outer.id


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
    # A queue of its own: the module's worker (alive while another of its parameters' tests
    # is to come) consumes the shared one, and would take the header tasks and fire the chord
    # itself, leaving this test's worker nothing to crash on.
    queue = f"{QUEUE}-lost-body"
    env = {"PIKKU_REAPER_INTERVAL": "1", "RESULTS_CHORD_RESEND_AFTER": "2", "RESULTS_QUEUE": queue}
    crash = {**env, "PIKKU_TEST_CRASH_AT": "before_chord_send:batch"}
    with results_app(pg_url) as app:
        app.app.conf.task_default_queue = queue
        sent: Any = chord([app.add.s(1, 1), app.add.s(2, 2)], app.total.s()).apply_async()
        # In SQL before any part: the batch that writes the last part claims it.
        assert app.pikku.mirror.flush()
        with worker_running(
            app, "redis", tmp, concurrency=1, queues=queue, extra_env=crash
        ) as first:
            try:
                wait_until(lambda: first.proc.poll() is not None, what="the crash point")
            except AssertionError as exc:
                # Which process claimed the chord instead, if one did: the worker's log says.
                raise AssertionError(f"{exc}\n{first.log.read_text()[-6000:]}") from None
            assert first.proc.returncode == -signal.SIGKILL
            with contextlib.suppress(ProcessLookupError):
                first.kill_all()  # its pool process, left without its parent
        with worker_running(
            app, "redis", tmp, concurrency=1, queues=queue, extra_env=env
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


def test_every_chord_fires_with_the_reaper_off_from_a_process_that_waited_before(
    pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The publisher's flusher writes each chord while the worker's writes its header's
    # results, in transactions at the same moment: no pass of the reaper finishes a chord
    # here, so each fires from the batches that wrote it and its parts, or never.
    tmp = tmp_path_factory.mktemp("chords-no-reaper")
    with results_app(pg_url) as app, worker_of_its_own(app, tmp, {"PIKKU_REAPER_INTERVAL": "0"}):
        assert app.plain_add.delay(1, 1).get(timeout=60) == 2
        for n in range(30):
            header = [app.plain_add.s(n, k) for k in range(3)]
            sent: Any = chord(header, app.total.s()).apply_async()
            assert sent.get(timeout=30) == 3 * n + 3, f"chord {n} of 30"


def test_a_chord_added_to_the_chord_by_a_header_task_counts_by_its_body(
    pg_url: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every task mirrored: the worker's journal, with the header task's add, often reaches
    # SQL before the publisher's, with the chord. No reaper pass sends a body here.
    monkeypatch.setenv("RESULTS_MIRROR", "all")
    tmp = tmp_path_factory.mktemp("chord-added-chord")
    with results_app(pg_url) as app, worker_of_its_own(app, tmp, {"PIKKU_REAPER_INTERVAL": "0"}):
        for n in range(10):
            grow = group([app.grow_by_chord.s([1, 2, 3], 4)])
            sent: Any = (grow | app.identity.s()).delay()
            assert sorted(sent.get(timeout=30)) == [0, 5 + 6 + 7], f"chord {n} of 10"


def test_a_frozen_chord_applied_again_sends_its_body_again(
    results: tuple[ModuleType, Worker],
) -> None:
    # As with Celery's Redis backend: the same group id, but each apply is a run of its own.
    app, worker = results
    frozen = chord(group(app.plain_add.s(1, 2), app.plain_add.s(3, 4)), app.total.s())
    body_id = frozen.freeze().id
    assert frozen.apply_async().get(timeout=60) == 10
    ran = f"results.total[{body_id}] succeeded"
    wait_until(lambda: worker.log.read_text().count(ran) == 1, what="the first body")
    assert frozen.apply_async().get(timeout=60) == 10
    wait_until(lambda: worker.log.read_text().count(ran) == 2, what="the body sent again")


def test_a_header_read_from_a_generator_is_sent_as_it_is_read(
    results: tuple[ModuleType, Worker],
) -> None:
    # Celery reads one task ahead of the one it sends: the generator waits, before its
    # third task, for the first to have run, which it cannot if the chord read it whole.
    app, _ = results
    first = app.plain_add.s(0, 0)
    first.freeze()

    def header() -> Iterator[Any]:
        yield first
        yield chain(app.plain_add.s(1, 1), app.plain_add.s(10))
        wait_until(lambda: app.app.AsyncResult(first.id).ready(), timeout=20, what="the first part")
        yield app.plain_add.s(2, 2)
        yield app.plain_add.s(3, 3)

    sent: Any = chord(header(), app.total.s()).apply_async()
    assert sent.get(timeout=60) == 0 + 12 + 4 + 6


@since_celery("5.5", "the errback is never run, as with its Redis backend")
def test_an_errback_runs_once_for_a_chord_in_a_chord_whose_header_failed(
    results: tuple[ModuleType, Worker],
) -> None:
    # The inner chord's body inherits the outer's errback and runs it as the inner chord
    # fails; as with Celery's Redis backend, the outer chord runs it no second time.
    app, worker = results
    errback = app.echo.si("errback called")
    inner = chord([app.identity.si("t1"), app.fail.si()], app.identity.si("t2 (body)"))
    outer = chord(group([app.identity.si("t3"), inner]), app.echo.si("chord body called"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CPendingDeprecationWarning)
        outer.link_error(errback)
    sent: Any = outer.delay()
    failed = app.app.AsyncResult(sent.id).get(timeout=60, propagate=False)
    assert isinstance(failed, ChordError)  # the outer body never ran
    # Anything the outer chord's failure published is in the queue before this message.
    after = app.echo.si("after")
    after_id = after.freeze().id
    assert after.apply_async().get(timeout=60) == "after"
    log = worker.log.read_text()
    assert "'chord body called'" not in log
    errbacks = [line for line in log.splitlines() if "results.echo[" in line]
    received = [line for line in errbacks if line.endswith("received")]
    assert len([line for line in received if after_id not in line]) == 1


def test_a_step_replaced_by_a_group_ends_with_the_group_and_so_does_its_run(
    results: tuple[ModuleType, Worker],
) -> None:
    """The body this backend sends for the replacement's chord carries the replaced step on:
    the step is not left ``running`` with its result in SQL, nor its run held open."""
    app, worker = results
    result = app.add_to_all.delay([1, 2, 3], 10)
    assert result.get(timeout=60) == [11, 12, 13]
    run = worker.wait_for_run(result.id, timeout=30)
    assert (run.status, run.output) == ("completed", [11, 12, 13])
    step = worker.store.get_step_state(result.id, "add_to_all")
    assert (step.status, step.result, step.attempt_count) == ("succeeded", [11, 12, 13], 1)
    [attempt] = [a for a in worker.store.get_run_history(result.id) if a.step_id == result.id]
    assert (attempt.status, attempt.replaced_by) == ("succeeded", "celery.accumulate")
    assert attempt.succeeded_at is not None


def test_a_replaced_link_of_a_chain_hands_its_groups_results_to_the_next_link(
    results: tuple[ModuleType, Worker],
) -> None:
    app, worker = results
    result = chain(app.add_to_all.s([1, 2], 1), app.sum_step.s()).delay()
    assert result.get(timeout=60) == 5
    run = worker.wait_for_run(result.id, timeout=30)
    assert (run.status, run.output) == ("completed", 5)
    steps = {s.step_name: s for s in worker.store.list_step_states(result.id)}
    assert {name: s.status for name, s in steps.items()} == dict.fromkeys(
        ("add_to_all", "add", "add#2", "sum_step"), "succeeded"
    )
    assert steps["add_to_all"].result == [2, 3]


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
    sent: Any = chord([app.identity.si(42)], failing).apply_async()
    with pytest.raises(KeyError, match="no belts"):
        sent.get(timeout=30)
    assert isinstance(app.app.AsyncResult(sent.id).get(timeout=30, propagate=False), KeyError)


@since_celery("5.7", "the chord never fires, as with its Redis backend")
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


def test_a_chain_body_fired_from_a_thread_of_another_current_app_goes_to_this_apps_broker(
    results: tuple[ModuleType, Worker],
) -> None:
    # The process whose batch completes a chord fires it from its flusher thread, whose
    # current app is Celery's default (no broker): a chain's links decoded from the kept
    # body must still be sent by the app that kept it.
    app, _ = results
    part = app.identity.delay(42)
    assert part.get(timeout=30) == 42
    body = chain(app.identity.s(), app.identity.s())
    last = body.freeze()
    kept = FiredChord(
        group_id=str(uuid.uuid4()), body=app.app.backend.encode(body), parts=(part.id,)
    )
    fired = threading.Thread(target=lambda: app.app.backend.fire_chords([kept]))
    fired.start()
    fired.join(timeout=30)
    assert app.app.AsyncResult(last.id).get(timeout=30) == [42]
