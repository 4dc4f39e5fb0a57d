"""What a publisher hands the mirror for a lone task (a run of its own), and the new step
the mirror's batch then writes of it."""

from __future__ import annotations

import datetime as dt

from pikku_celery.mirror import Journal, PublishedStep, Recorder
from pikku_celery.mirror.sinks import InlineSink
from pikku_celery.store import NewRun, NewStep


def lone(step_id: str, name: str = "charge") -> PublishedStep:
    """Task ``shop.<name>`` published on its own, with ``step_id`` as its run's id too."""
    return PublishedStep(
        run_id=step_id,
        step_id=step_id,
        step_name=name,
        rpc_name=f"shop.{name}",
        data={"args": [1], "kwargs": {}},
        new_run=NewRun(f"shop.{name}", {"args": [1]}, {"type": "task"}),
    )


def lone_step(
    step_id: str, at: dt.datetime, name: str = "charge", *, chord_body: str | None = None
) -> NewStep:
    """The batch's new step of task ``shop.<name>`` published on its own at ``at``, with its
    run (named ``step_id`` too); ``chord_body``: a chord's header task, holding its run."""
    return NewStep(
        run_id=step_id,
        step_id=step_id,
        step_name=name,
        rpc_name=f"shop.{name}",
        data_json="[1]",
        at=at,
        run_workflow=f"shop.{name}",
        run_input_json="[1]",
        run_wire_json='{"type":"task"}',
        chord_body=chord_body,
    )


def own_journal(recorder: Recorder) -> Journal:
    """The journal a recorder writes its own events to (it has journaled one already)."""
    sink = recorder.sink
    assert isinstance(sink, InlineSink), f"{type(sink).__name__} writes no journal of its own"
    journal = sink.journal()
    assert journal is not None, "nothing journaled yet"
    return journal
