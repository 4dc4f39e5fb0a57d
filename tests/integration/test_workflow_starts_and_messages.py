"""What a caller is told: a start the workflow cannot take, a second start with other
arguments, an input that is not JSON, a failed run that is no workflow.

On the real store; a dispatcher records what would be sent (``tests.support.durable``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from pikku_celery import PikkuCelery, RunFailed, SerializationError, WorkflowStore
from pikku_celery.integration.task import WorkflowTask
from tests.support.durable import durable_pikku, settle


@pytest.fixture
def pikku(store: WorkflowStore) -> Iterator[PikkuCelery]:
    with durable_pikku(store) as pikku:
        yield pikku


class Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


class NoteTask(WorkflowTask):
    name = "tests.messages.note"


note = NoteTask()


# --- start() holds its arguments against the workflow's signature -----------------------


def test_a_start_the_workflow_cannot_take_raises_at_once_and_makes_no_run(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    @pikku.workflow("checkout")
    def checkout(ctx: Any, order_id: int, express: bool = False) -> int:
        return order_id

    with pytest.raises(TypeError) as unknown:
        checkout.start(order_id=1, bogus=1)
    message = str(unknown.value)
    assert "unexpected keyword argument 'bogus'" in message
    assert "after ctx (order_id, express=False)" in message  # what it does take
    with pytest.raises(TypeError, match="missing a required argument: 'order_id'"):
        checkout.start(run_id="order-9")
    with pytest.raises(TypeError, match="too many positional arguments"):
        checkout.start(1, True, "third")
    assert store.list_runs() == []
    run_id = checkout.start(1, express=True)
    assert settle(pikku) == ["completed"]
    assert store.get_run(run_id).output == 1


def test_a_second_start_with_the_same_id_and_other_arguments_says_so(
    pikku: PikkuCelery, store: WorkflowStore, caplog: pytest.LogCaptureFixture
) -> None:
    @pikku.workflow("checkout")
    def checkout(ctx: Any, order_id: int, items: Any = ()) -> int:
        return order_id

    with caplog.at_level(logging.WARNING, logger="pikku_celery.workflows.engine"):
        assert checkout.start(1, items=("a", "b"), run_id="order-1") == "order-1"
        # The same call again (a retried request): tuples come back from JSON as lists.
        assert checkout.start(1, items=("a", "b"), run_id="order-1") == "order-1"
        assert caplog.records == []
        assert checkout.start(2, run_id="order-1") == "order-1"
    [line] = caplog.records
    assert getattr(line, "action", None) == "start_arguments_differ"
    text = line.getMessage()
    assert "order-1" in text and "were not used" in text and "run_id" in text
    assert '"args": [2]' in text and '"args": [1]' in text
    assert store.get_run("order-1").input == {"args": [1], "kwargs": {"items": ["a", "b"]}}


# --- inputs that are not JSON are told to be passed as JSON ------------------------------


def test_inputs_that_are_not_json_are_told_to_pass_json(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    @pikku.workflow("noting")
    def noting(ctx: Any, what: Any) -> Any:
        return ctx.do("note", note, Opaque()) if what == "step" else ctx.wait_for("go")

    with pytest.raises(SerializationError) as raised:
        noting.start(Opaque())
    message = str(raised.value)
    assert "The input of workflow 'noting' cannot be stored as JSON" in message
    assert "pass JSON types (dict, list, str, int, float, bool, None) as input" in message
    assert "return JSON types" not in message
    assert store.list_runs() == []

    step_run = noting.start("step")
    waiting = noting.start("event")
    assert sorted(settle(pikku)) == ["failed", "sleeping"]
    error = store.get_run(step_run).error
    assert error is not None
    assert "The input of step 'note' cannot be stored as JSON" in error["message"]
    assert "as input" in error["message"] and "return JSON types" not in error["message"]

    with pytest.raises(SerializationError) as event:
        pikku.send(waiting, "go", {"when": Opaque()})
    assert "The data of event 'go' cannot be stored as JSON" in str(event.value)
    assert "return JSON types" not in str(event.value)


def test_an_input_too_large_keeps_the_stores_advice(pikku: PikkuCelery) -> None:
    @pikku.workflow("big")
    def big(ctx: Any, blob: str) -> None:
        return None

    pikku.store.codec.max_bytes = 100
    with pytest.raises(SerializationError, match="store a reference to the data"):
        big.start("x" * 200)


# --- RunFailed says what to do for the kind of run it is ---------------------------------


def test_a_failed_canvas_or_task_is_told_to_be_published_again_not_resumed(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    canvas = store.create_run("checkout", {}, wire={"type": "canvas"})
    store.attempts.settle_run(canvas, "failed", {"type": "RuntimeError", "message": "no courier"})
    with pytest.raises(RunFailed) as raised:
        pikku.wait(canvas, timeout=1)
    message = str(raised.value)
    assert raised.value.kind == "canvas"
    assert "no courier" in message and f"pikku-celery runs show {canvas}" in message
    assert "publish the canvas again (`pikku.run(signature, name=...)`" in message
    assert "pikku.resume" not in message

    task = store.create_run("shop.charge", {}, wire={"type": "task"})
    store.attempts.settle_run(task, "failed", "card declined")
    with pytest.raises(RunFailed, match=r"publish the task again \(`task.delay\(...\)`"):
        pikku.wait(task, timeout=1)


def test_a_failed_workflow_run_is_told_to_be_resumed(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    @pikku.workflow("failing")
    def failing(ctx: Any) -> None:
        raise RuntimeError("no courier")

    run_id = failing.start()
    settle(pikku)
    with pytest.raises(RunFailed) as raised:
        pikku.wait(run_id, timeout=1)
    assert raised.value.kind == "workflow"
    assert f"fix the cause and `pikku.resume({run_id!r})` it" in str(raised.value)
