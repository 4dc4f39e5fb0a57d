"""A chord holds its run open until its body is out, and a late start keeps the row's worker.

Written as the mirror writes them (store batches), on SQLite and PostgreSQL. Celery publishes
a chord's body only once its header is done (from the last header task, or from a
``chord_unlock``), so there is a moment when every step of the run has succeeded and the
body is not there yet: the run must not be completed then, with a header's result as output.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid

from pikku_celery.store import NewRun, NewStep, RunOutcome, StepTransition, WorkflowStore
from tests.support.transitions import apply, new_step, start, succeed


def _run(store: WorkflowStore) -> str:
    return store.create_run("totals", {"args": [], "kwargs": {}}, wire={"type": "canvas"})


def lone_task(store: WorkflowStore, name: str, body_id: str | None = None) -> NewStep:
    """A task published outside any run (a run of its own), in the header of the chord
    whose body is ``body_id`` when its message says so."""
    step_id = str(uuid.uuid4())
    step = new_step(
        store,
        step_id,
        name,
        rpc_name=f"shop.{name}",
        step_id=step_id,
        new_run=NewRun(f"shop.{name}", {"args": []}, {"type": "task"}),
    )
    return dataclasses.replace(step, chord_body=body_id)


def fail_for_good(store: WorkflowStore, step_id: str, *bodies: str) -> None:
    """The step's attempt failed for good, naming the bodies of the chords it was in."""
    moment = dt.datetime.now(dt.timezone.utc)
    error = json.dumps({"type": "ValueError", "message": "bad", "traceback": None})
    apply(
        store,
        transitions=[
            StepTransition(
                step_id, 1, "failed", moment, ended_at=moment, error_json=error, gave_up=True
            )
        ],
        outcomes=[RunOutcome(step_id, None, "failed", moment, error, chord_bodies=bodies)],
    )


def test_a_run_waits_for_its_chords_body_after_the_header_succeeded(store: WorkflowStore) -> None:
    run_id = _run(store)
    body_id = str(uuid.uuid4())
    header = [
        dataclasses.replace(
            new_step(store, run_id, "add", rpc_name="shop.add", data={"args": [n, n]}),
            chord_body=body_id,
        )
        for n in (1, 2, 3)
    ]
    result = apply(store, steps=header)
    assert result.missing == frozenset()
    for n, step in enumerate(header, start=1):
        start(store, step.step_id)
        succeed(store, step.step_id, 1, n * 2)
    assert store.get_run(run_id).status == "running"  # the body is not out yet

    body = new_step(
        store,
        run_id,
        "total",
        rpc_name="shop.total",
        data={"args": [[2, 4, 6]]},
        step_id=body_id,
        parent_step_id=header[-1].step_id,
    )
    assert apply(store, steps=[body]).missing == frozenset()
    assert store.get_run(run_id).status == "running"  # out, not done
    start(store, body_id)
    succeed(store, body_id, 1, 12)
    run = store.get_run(run_id)
    assert (run.status, run.output) == ("completed", 12)


def test_a_header_task_published_twice_opens_its_chord_once(store: WorkflowStore) -> None:
    run_id = _run(store)
    body_id = str(uuid.uuid4())
    step = dataclasses.replace(
        new_step(store, run_id, "add", rpc_name="shop.add"), chord_body=body_id
    )
    apply(store, steps=[step])
    assert apply(store, steps=[step]).missing == frozenset()  # a republish: nothing new
    start(store, step.step_id)
    succeed(store, step.step_id, 1, 2)
    assert store.get_run(run_id).status == "running"
    store.delete_run(run_id)  # its chords go with it
    assert store.list_runs() == []


def test_a_late_start_of_an_earlier_delivery_keeps_where_the_attempt_ran_last(
    store: WorkflowStore,
) -> None:
    run_id = _run(store)
    step = new_step(store, run_id, "slow", rpc_name="shop.slow")
    apply(store, steps=[step])
    first = dt.datetime.now(dt.timezone.utc)
    # The redelivery's start is written first; the killed pool child's own start comes
    # later, when its journal is adopted.
    start(store, step.step_id, worker="w@host", pid=2222, at=first + dt.timedelta(seconds=5))
    start(store, step.step_id, worker="w@host", pid=1111, at=first)
    [attempt] = store.get_run_history(run_id)
    assert (attempt.pid, attempt.delivery_count) == (2222, 2)

    # In order, a later delivery's start is where it ran last.
    start(store, step.step_id, worker="w2@host", pid=3333, at=first + dt.timedelta(seconds=9))
    [attempt] = store.get_run_history(run_id)
    assert (attempt.worker, attempt.pid, attempt.delivery_count) == ("w2@host", 3333, 3)


def test_a_chord_applied_outside_a_run_releases_every_header_run_once_its_body_is_out(
    store: WorkflowStore,
) -> None:
    # chord([add.s(1, 1), add.s(2, 2)], total.s()).delay() from a web request: each header
    # task is a run of its own, the first one written holds the chord, and the body goes
    # into the run of whichever header task ended last: here the other one.
    body_id = str(uuid.uuid4())
    header = []
    for n in (1, 2):
        step_id = str(uuid.uuid4())
        header.append(
            dataclasses.replace(
                new_step(
                    store,
                    step_id,
                    "add",
                    rpc_name="shop.add",
                    data={"args": [n, n]},
                    step_id=step_id,
                    new_run=NewRun("shop.add", {"args": [n, n]}, {"type": "task"}),
                ),
                chord_body=body_id,
            )
        )
    assert apply(store, steps=header).missing == frozenset()
    for n, step in enumerate(header, start=1):
        start(store, step.step_id)
        succeed(store, step.step_id, 1, n * 2)
    held, last = header[0].step_id, header[1].step_id
    assert store.get_run(held).status == "running"  # its chord's body is not out yet

    body = new_step(
        store, last, "total", rpc_name="shop.total", step_id=body_id, parent_step_id=last
    )
    assert apply(store, steps=[body]).missing == frozenset()
    run = store.get_run(held)
    assert (run.status, run.output) == ("completed", 2)  # released with the body out
    start(store, body_id)
    succeed(store, body_id, 1, 6)
    assert store.get_run(last).status == "completed"


def test_a_header_task_failing_for_good_fails_the_run_its_chord_holds(
    store: WorkflowStore,
) -> None:
    # The same chord applied outside any run, and its second header task fails: Celery
    # fails the body in its backend and never sends it, so the run that held the chord
    # for it must end then, not stay running for ever.
    body_id = str(uuid.uuid4())
    header = [lone_task(store, "add", body_id), lone_task(store, "refuse", body_id)]
    apply(store, steps=header)
    held, failing = header[0].step_id, header[1].step_id
    start(store, held)
    succeed(store, held, 1, 2)
    assert store.get_run(held).status == "running"

    start(store, failing)
    fail_for_good(store, failing, body_id)
    assert store.get_run(failing).status == "failed"
    run = store.get_run(held)
    assert run.status == "failed"
    assert run.error is not None and run.error["type"] == "celery.exceptions.ChordError"
    assert failing in run.error["message"] and body_id in run.error["message"]


def test_a_failed_task_of_a_chord_in_a_chords_header_fails_the_run_the_outer_chord_holds(
    store: WorkflowStore,
) -> None:
    # chord([add.s(1, 1), chord([fail.s()], inner.s())], outer.s()) outside any run: the
    # failing task's own chord is the inner one, whose body is a part of the outer chord;
    # Celery fails both bodies and sends neither.
    outer, inner = str(uuid.uuid4()), str(uuid.uuid4())
    held, failing = lone_task(store, "add", outer), lone_task(store, "fail", inner)
    apply(store, steps=[held, failing])
    start(store, held.step_id)
    succeed(store, held.step_id, 1, 2)
    start(store, failing.step_id)
    fail_for_good(store, failing.step_id, inner, outer)
    run = store.get_run(held.step_id)
    assert run.status == "failed"
    assert run.error is not None and outer in run.error["message"]


def test_a_header_task_failed_before_the_others_are_written_leaves_no_run_held(
    store: WorkflowStore,
) -> None:
    # The failure reaches SQL before the publish of the chord's other header task (another
    # process's journal): that task's run, written later, must not wait for the body.
    body_id = str(uuid.uuid4())
    first = lone_task(store, "fail")  # a chain's first link: its publish names no chord
    apply(store, steps=[first])
    start(store, first.step_id)
    fail_for_good(store, first.step_id, body_id)
    later = lone_task(store, "add", body_id)
    apply(store, steps=[later])
    start(store, later.step_id)
    succeed(store, later.step_id, 1, 2)
    assert store.get_run(later.step_id).status == "completed"
    assert store.get_run(first.step_id).status == "failed"
