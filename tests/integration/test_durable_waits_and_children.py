"""Child runs, waits for events, branches and idempotent starts, on the real store.

A dispatcher records what replays send instead of sending it, and the test
plays the worker (``tests.support.durable``): it replays each run a replay
asked for, in order. The acceptance tests run the same engine on real workers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from pikku_celery import (
    EventTimeout,
    PikkuCelery,
    RunIdTaken,
    RunNotFound,
    RunSettled,
    StepFailed,
    WorkflowStore,
    current_step,
)
from pikku_celery.integration.step_info import PIKKU_NAMESPACE
from pikku_celery.workflows.definition import Workflow
from tests.support.durable import Recorder, durable_pikku, settle
from tests.support.threads import run_threads


@pytest.fixture
def pikku(store: WorkflowStore) -> Iterator[PikkuCelery]:
    with durable_pikku(store) as pikku:
        yield pikku


def recorder(pikku: PikkuCelery) -> Recorder:
    dispatcher = pikku.workflows.dispatcher
    assert isinstance(dispatcher, Recorder)
    return dispatcher


# --- idempotent starts ------------------------------------------------------------------


def test_twenty_concurrent_starts_with_one_id_make_one_run(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    @pikku.workflow("checkout")
    def checkout(ctx: Any, order_id: int) -> int:
        return order_id

    run_ids: list[str] = []
    run_threads(20, lambda _: run_ids.append(checkout.start(order_id=1, run_id="order-1")))
    assert run_ids == ["order-1"] * 20
    assert [run.run_id for run in store.list_runs()] == ["order-1"]
    assert recorder(pikku).replays == [("order-1", None)]  # one start sent one replay
    assert settle(pikku) == ["completed"]
    assert checkout.start(order_id=1, run_id="order-1") == "order-1"
    assert recorder(pikku).replays == []


def test_an_idempotency_key_gives_every_start_the_same_run(pikku: PikkuCelery) -> None:
    @pikku.workflow("checkout")
    def checkout(ctx: Any, order_id: int) -> int:
        return order_id

    @pikku.workflow("refund")
    def refund(ctx: Any) -> None:
        return None

    first = checkout.start(order_id=1, idempotency_key="request-7")
    assert checkout.start(order_id=1, idempotency_key="request-7") == first
    assert checkout.start(order_id=1, idempotency_key="request-8") != first
    assert uuid.UUID(first)  # derived, the same in every process
    with pytest.raises(RunIdTaken, match="give this start another run_id"):
        refund.start(run_id=first)


# --- waits for events -------------------------------------------------------------------


def approval_flow(pikku: PikkuCelery, timeout: float | None = None) -> Workflow:
    @pikku.workflow("refund")
    def refund(ctx: Any, amount: int) -> dict[str, Any]:
        try:
            decision = ctx.wait_for("approval", timeout=timeout)
        except EventTimeout:
            return {"refunded": 0, "why": "nobody decided in time"}
        return {"refunded": amount if decision["approved"] else 0, "by": decision["by"]}

    return refund


def test_an_event_sent_while_the_run_waits_wakes_it_with_its_data(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    run_id = approval_flow(pikku).start(amount=30)
    assert settle(pikku) == ["sleeping"]
    assert store.get_run(run_id).status == "suspended"
    waiting = store.get_step_state(run_id, "approval")
    assert (waiting.status, waiting.rpc_name) == ("scheduled", "pikku.wait")
    pikku.send(run_id, "approval", {"approved": True, "by": "ana"})
    assert settle(pikku) == ["completed"]
    assert store.get_run(run_id).output == {"refunded": 30, "by": "ana"}
    step = store.get_step_state(run_id, "approval")
    assert (step.status, step.result) == ("succeeded", {"approved": True, "by": "ana"})
    [event] = store.list_events(run_id)
    assert event.taken_by_step_id == step.step_id


def test_an_event_sent_before_the_wait_is_kept_for_it(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    @pikku.workflow("later")
    def later(ctx: Any) -> Any:
        ctx.do("prepare", lambda: "ready")
        return ctx.wait_for("go")

    run_id = later.start()
    pikku.send(run_id, "go", {"n": 1})  # before any replay reached the wait
    assert settle(pikku) == ["completed", "settled"]  # the send's replay finds it done
    assert store.get_run(run_id).output == {"n": 1}


def test_two_sends_for_one_wait_deliver_one_and_keep_the_other(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    run_id = approval_flow(pikku).start(amount=5)
    settle(pikku)
    run_threads(
        2, lambda n: pikku.send(run_id, "approval", {"approved": True, "by": f"person-{n}"})
    )
    # Both replays run at once, as two workers would run them.
    run_threads(2, lambda _: settle(pikku))
    run = store.get_run(run_id)
    assert run.status == "completed"
    events = store.list_events(run_id)
    taken = [event for event in events if event.taken_by_step_id]
    assert len(events) == 2 and len(taken) == 1
    assert run.output["by"] == taken[0].data["by"]


def test_a_wait_that_times_out_raises_event_timeout_in_the_workflow(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    run_id = approval_flow(pikku, timeout=0.2).start(amount=5)
    assert settle(pikku) == ["sleeping"]
    [(_, deadline)] = recorder(pikku).replays  # the durable deadline: a replay at that time
    assert deadline is not None
    time.sleep(0.3)
    assert settle(pikku) == ["completed"]
    assert store.get_run(run_id).output == {"refunded": 0, "why": "nobody decided in time"}
    step = store.get_step_state(run_id, "approval")
    assert step.status == "failed" and step.error is not None
    assert step.error["code"] == "EVENT_TIMEOUT"
    with pytest.raises(RunSettled, match="resume/rerun this one first"):
        pikku.send(run_id, "approval", {"approved": True, "by": "late"})


def test_sending_to_an_unknown_run_is_an_error(pikku: PikkuCelery) -> None:
    with pytest.raises(RunNotFound):
        pikku.send("no-such-run", "approval", {})


# --- child workflows --------------------------------------------------------------------


def parent_and_child(pikku: PikkuCelery, fail_child: list[bool]) -> tuple[Workflow, Workflow]:
    @pikku.workflow("ship")
    def ship(ctx: Any, order_id: int) -> str:
        label = ctx.do("label", lambda: f"label-{order_id}")
        if fail_child[0]:
            ctx.do("carrier", _carrier_down)
        return str(label)

    @pikku.workflow("order")
    def order(ctx: Any, order_id: int) -> Any:
        ctx.do("charge", lambda: "charged")
        try:
            return ctx.do("ship", ship, order_id)
        except StepFailed as failure:
            ctx.do("refund", lambda: "refunded")
            return {"compensated": failure.step_name}

    return order, ship


def _carrier_down() -> None:
    raise ConnectionError("carrier is down")


def test_a_child_workflow_completes_and_its_output_is_the_parent_step_result(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    order, _ = parent_and_child(pikku, [False])
    run_id = order.start(order_id=9)
    assert settle(pikku) == ["waiting", "completed", "completed"]
    assert store.get_run(run_id).output == "label-9"
    step = store.get_step_state(run_id, "ship")
    assert step.status == "succeeded" and step.child_run_id is not None
    assert step.rpc_name == "pikku.workflow:ship"
    child = store.get_run(step.child_run_id)
    assert child.wire["parent_run_id"] == run_id
    assert child.wire["parent_step_id"] == step.step_id
    # The child's id is the parent step's key: a replay cannot make a second child.
    assert step.child_run_id == str(uuid.uuid5(PIKKU_NAMESPACE, f"{run_id}:ship"))
    pikku.store.claims.move_run(run_id, "running", from_statuses=("completed",))
    recorder(pikku).orchestrate(run_id)
    settle(pikku)
    assert len(store.list_runs()) == 2


def test_a_child_that_fails_fails_the_parent_step_and_the_parent_compensates(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    order, _ = parent_and_child(pikku, [True])
    run_id = order.start(order_id=3)
    settle(pikku)
    assert store.get_run(run_id).output == {"compensated": "ship"}
    step = store.get_step_state(run_id, "ship")
    assert step.status == "failed" and step.error is not None
    assert step.error["type"] == "pikku_celery.ChildRunFailed"
    assert store.get_run(step.child_run_id or "").status == "failed"


def test_resuming_the_parent_resumes_its_failed_child_where_it_ended(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    fail = [True]

    @pikku.workflow("ship")
    def ship(ctx: Any) -> str:
        ctx.do("label", lambda: "label")
        if fail[0]:
            ctx.do("carrier", _carrier_down)
        return "shipped"

    @pikku.workflow("order")
    def order(ctx: Any) -> Any:
        return ctx.do("ship", ship)

    run_id = order.start()
    settle(pikku)
    assert store.get_run(run_id).status == "failed"
    fail[0] = False
    pikku.resume(run_id)
    settle(pikku)
    assert store.get_run(run_id).output == "shipped"
    child_id = store.get_step_state(run_id, "ship").child_run_id or ""
    assert store.get_step_state(child_id, "label").attempt_count == 1  # kept, not redone


def test_cancelling_the_parent_cancels_its_unfinished_child(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    @pikku.workflow("child")
    def child(ctx: Any) -> Any:
        return ctx.wait_for("never")

    @pikku.workflow("parent")
    def parent(ctx: Any) -> Any:
        return ctx.do("child", child)

    run_id = parent.start()
    settle(pikku)
    child_id = store.get_step_state(run_id, "child").child_run_id or ""
    assert store.get_run(child_id).status == "suspended"
    assert pikku.cancel(run_id) == ["child"]
    assert store.get_run(run_id).status == "cancelled"
    assert store.get_run(child_id).status == "cancelled"
    assert store.get_step_state(child_id, "never").status == "cancelled"


# --- branches and step identity ---------------------------------------------------------


def test_a_branch_is_recorded_on_the_step_that_decided_it_once(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    @pikku.workflow("route")
    def route(ctx: Any, amount: int) -> str:
        size = ctx.do("size", lambda: "big" if amount > 100 else "small")
        ctx.branch(size)
        return ctx.wait_for("done") if size == "big" else "small"

    run_id = route.start(amount=500)
    settle(pikku)
    assert store.get_step_state(run_id, "size").branch_taken == "big"
    pikku.send(run_id, "done", "ok")
    settle(pikku)
    assert store.get_run(run_id).output == "ok"


def test_an_inline_step_knows_its_run_step_attempt_and_idempotency_key(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    seen: list[Any] = []

    @pikku.workflow("keys")
    def keys(ctx: Any) -> None:
        ctx.do("pay", lambda: seen.append(current_step()))

    run_id = keys.start()
    settle(pikku)
    [info] = seen
    assert (info.run_id, info.step_name, info.attempt) == (run_id, "pay", 1)
    assert info.idempotency_key == str(uuid.uuid5(PIKKU_NAMESPACE, f"{run_id}:pay"))
