"""What a publisher's handler hands the mirror for a lone task (a run of its own)."""

from __future__ import annotations

from pikku_celery.mirror import Journal, PublishedStep, Recorder
from pikku_celery.mirror.sinks import InlineSink
from pikku_celery.store import NewRun


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


def own_journal(recorder: Recorder) -> Journal:
    """The journal a recorder writes its own events to (it has journaled one already)."""
    sink = recorder.sink
    assert isinstance(sink, InlineSink), f"{type(sink).__name__} writes no journal of its own"
    journal = sink.journal()
    assert journal is not None, "nothing journaled yet"
    return journal
