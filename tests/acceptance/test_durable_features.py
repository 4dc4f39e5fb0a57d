"""Child workflows, waits for events, idempotent starts and step keys on real workers.

Prefork workers, a Redis broker and a PostgreSQL mirror, as in production.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from types import ModuleType

import pytest
import sqlalchemy as sa

from pikku_celery.integration.step_info import PIKKU_NAMESPACE
from tests.acceptance.conftest import (
    QUEUE,
    Worker,
    effects,
    start_worker,
    wait_until,
    worker_running,
)
from tests.support.threads import run_threads


@pytest.fixture(scope="module")
def durable_worker(shop: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    yield from start_worker(shop, "redis", tmp_path_factory.mktemp("durable"))


def _tag() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def _child_of(worker: Worker, run_id: str, step: str = "ship") -> str:
    wait_until(
        lambda: worker.store.get_step_state(run_id, step).child_run_id,
        what=f"the child run of step {step}",
    )
    child = worker.store.get_step_state(run_id, step).child_run_id
    assert child is not None
    return child


def _queue_empty(shop: ModuleType) -> bool:
    """Nothing left for a worker: a message left behind would run in the next test's worker."""
    with shop.app.connection_for_write() as conn:
        return not conn.default_channel.client.llen(QUEUE)


# --- child workflows --------------------------------------------------------------------


def test_a_child_workflow_runs_as_its_own_run_and_its_output_is_the_step_result(
    shop: ModuleType, durable_worker: Worker
) -> None:
    tag = _tag()
    run_id = shop.order_with_shipping.start(tag)
    assert shop.pikku.wait(run_id, timeout=45) == {"label": len(f"{tag}-label")}
    step = durable_worker.store.get_step_state(run_id, "ship")
    assert (step.status, step.rpc_name) == ("succeeded", "pikku.workflow:ship-order")
    child = durable_worker.store.get_run(step.child_run_id or "")
    assert (child.workflow, child.status) == ("ship-order", "completed")
    assert child.wire == {
        "type": "workflow",
        "parent_run_id": run_id,
        "parent_step_id": step.step_id,
        "parent_step_name": "ship",
    }
    assert [effects(durable_worker, f"{tag}-{s}") for s in ("charge", "label", "notify")] == [
        1,
        1,
        1,
    ]


def test_a_child_that_fails_fails_its_step_and_the_parent_compensates(
    shop: ModuleType, durable_worker: Worker
) -> None:
    tag = _tag()
    run_id = shop.order_with_shipping.start(tag, fail=True)
    assert shop.pikku.wait(run_id, timeout=45) == {"compensated": "ship"}
    child = durable_worker.store.get_run(_child_of(durable_worker, run_id))
    assert child.status == "failed"
    step = durable_worker.store.get_step_state(run_id, "ship")
    assert step.status == "failed" and step.error is not None
    assert step.error["child_run_id"] == child.run_id
    assert effects(durable_worker, f"{tag}-refund") == 1
    assert effects(durable_worker, f"{tag}-notify") == 0


def test_a_worker_killed_while_a_child_runs_leaves_nothing_done_twice(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("killed-child")
    tag = _tag()
    with worker_running(shop, "redis", tmp) as first:
        run_id = shop.order_with_shipping.start(tag, seconds=4)
        child_id = _child_of(first, run_id)
        wait_until(
            lambda: first.store.get_step_state(child_id, "pack").status == "running",
            what="the child's slow step to run",
        )
        first.kill_all()
    with worker_running(shop, "redis", tmp) as second:
        run = second.wait_for_run(run_id, timeout=45)
        assert (run.status, run.output) == ("completed", {"label": len(f"{tag}-label")})
        assert second.store.get_run(child_id).status == "completed"
        # Each step that succeeded did its work once; the interrupted one ran again.
        assert [effects(second, f"{tag}-{s}") for s in ("charge", "label", "pack", "notify")] == [
            1,
            1,
            1,
            1,
        ]
        assert len([r for r in second.store.list_runs(limit=500) if r.run_id == child_id]) == 1


def test_cancelling_a_parent_cancels_its_unfinished_child(
    shop: ModuleType, durable_worker: Worker
) -> None:
    tag = _tag()
    run_id = shop.order_with_shipping.start(tag, seconds=3)
    child_id = _child_of(durable_worker, run_id)
    wait_until(
        lambda: durable_worker.store.get_step_state(child_id, "pack").status == "running",
        what="the child's slow step to run",
    )
    assert shop.pikku.cancel(run_id) == ["ship"]
    assert durable_worker.store.get_run(child_id).status == "cancelled"
    assert durable_worker.store.get_step_state(child_id, "pack").status == "cancelled"
    # A revoke does not stop a running task: it ends, and its end changes nothing.
    wait_until(lambda: effects(durable_worker, f"{tag}-pack") == 1, what="the step to end")
    wait_until(lambda: _queue_empty(shop), what="the replay its end sent")
    assert durable_worker.store.get_run(run_id).status == "cancelled"
    assert durable_worker.store.get_run(child_id).status == "cancelled"
    assert effects(durable_worker, f"{tag}-notify") == 0


# --- waits for events -------------------------------------------------------------------


def _suspended(worker: Worker, run_id: str) -> None:
    wait_until(
        lambda: worker.store.get_run(run_id).status == "suspended",
        what="the run to wait for its event",
    )


def test_an_event_sent_after_the_wait_is_reached_is_its_result(
    shop: ModuleType, durable_worker: Worker
) -> None:
    run_id = shop.refund_approval.start(40)
    _suspended(durable_worker, run_id)
    shop.pikku.send(run_id, "approval", {"approved": True, "by": "ana@shop"})
    assert shop.pikku.wait(run_id, timeout=45) == {"refunded": 40, "approved_by": "ana@shop"}
    step = durable_worker.store.get_step_state(run_id, "approval")
    assert step.result == {"approved": True, "by": "ana@shop"}  # who approved, in the history
    assert step.branch_taken == "approved"


def test_an_event_sent_before_the_wait_is_reached_is_kept_for_it(
    shop: ModuleType, durable_worker: Worker
) -> None:
    run_id = shop.refund_approval.start(15, prepare=1.5)
    wait_until(
        lambda: durable_worker.store.get_step_state(run_id, "prepare").status == "running",
        what="the step before the wait",
    )
    shop.pikku.send(run_id, "approval", {"approved": False, "by": "bo@shop"})
    assert shop.pikku.wait(run_id, timeout=45) == {"refunded": 0, "approved_by": "bo@shop"}
    [event] = durable_worker.store.list_events(run_id)
    assert event.taken_by_step_id == durable_worker.store.get_step_state(run_id, "approval").step_id


def test_a_wait_times_out_durably_and_the_workflow_catches_it(
    shop: ModuleType, durable_worker: Worker
) -> None:
    started = time.monotonic()
    run_id = shop.refund_approval.start(15, timeout=1.0)
    assert shop.pikku.wait(run_id, timeout=45) == {
        "refunded": 0,
        "why": "nobody decided in time",
    }
    assert time.monotonic() - started >= 1.0
    step = durable_worker.store.get_step_state(run_id, "approval")
    assert step.status == "failed" and (step.error or {}).get("code") == "EVENT_TIMEOUT"


def test_two_sends_for_one_wait_deliver_exactly_one(
    shop: ModuleType, durable_worker: Worker
) -> None:
    run_id = shop.refund_approval.start(10)
    _suspended(durable_worker, run_id)
    run_threads(
        2,
        lambda n: shop.pikku.send(run_id, "approval", {"approved": True, "by": f"person-{n}"}),
    )
    output = shop.pikku.wait(run_id, timeout=45)
    events = durable_worker.store.list_events(run_id)
    taken = [event for event in events if event.taken_by_step_id is not None]
    assert len(events) == 2 and len(taken) == 1
    assert output == {"refunded": 10, "approved_by": taken[0].data["by"]}


def test_a_wait_and_its_timeout_survive_a_worker_restart(
    shop: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("restart-wait")
    with worker_running(shop, "redis", tmp) as first:
        waiting = shop.refund_approval.start(20)
        timing_out = shop.refund_approval.start(20, timeout=4.0)
        _suspended(first, waiting)
        _suspended(first, timing_out)
        first.kill_all()  # the deadline's message dies with it, held by the worker
    with worker_running(shop, "redis", tmp) as second:
        shop.pikku.send(waiting, "approval", {"approved": True, "by": "cy@shop"})
        assert shop.pikku.wait(waiting, timeout=45) == {"refunded": 20, "approved_by": "cy@shop"}
        assert second.wait_for_run(timing_out, timeout=30).output == {
            "refunded": 0,
            "why": "nobody decided in time",
        }


# --- idempotent starts and step keys ------------------------------------------------------


def test_twenty_concurrent_starts_with_one_id_give_one_run(
    shop: ModuleType, durable_worker: Worker
) -> None:
    tag = _tag()
    run_id = f"order-{tag}"
    run_ids: list[str] = []
    run_threads(20, lambda _: run_ids.append(shop.order_with_shipping.start(tag, run_id=run_id)))
    assert run_ids == [run_id] * 20
    assert shop.pikku.wait(run_id, timeout=45) == {"label": len(f"{tag}-label")}
    with durable_worker.store.engine.connect() as conn:
        runs = conn.execute(
            sa.text("SELECT count(*) FROM workflow_runs WHERE workflow_run_id = :id"),
            {"id": run_id},
        ).scalar_one()
    assert runs == 1
    assert effects(durable_worker, f"{tag}-charge") == 1


def test_a_steps_idempotency_key_is_the_same_on_every_attempt_and_after_resume(
    shop: ModuleType, durable_worker: Worker
) -> None:
    tag = _tag()
    run_id = shop.keyed_payment.start(tag)
    durable_worker.wait_for_run(run_id)
    assert durable_worker.store.get_run(run_id).status == "failed"
    with shop.pikku.store.engine.begin() as conn:  # the fix is deployed
        conn.execute(
            sa.text("INSERT INTO shop_effects (label, pid) VALUES (:label, 0)"),
            {"label": f"{tag}-fixed"},
        )
    shop.pikku.resume(run_id)
    key = shop.pikku.wait(run_id, timeout=45)
    assert key == str(uuid.uuid5(PIKKU_NAMESPACE, f"{run_id}:pay"))
    seen = [
        line.split()[2:]
        for line in durable_worker.journal_lines()
        if line.startswith(f"keyed {tag} ")
    ]
    assert seen == [["1", key], ["2", key], ["3", key]]
