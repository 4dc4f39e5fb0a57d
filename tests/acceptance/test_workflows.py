"""Durable workflows on real prefork workers, Redis broker, PostgreSQL mirror."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from pikku_celery.errors import RunFailed
from tests.acceptance.conftest import Worker, start_worker, wait_until


@pytest.fixture(scope="module")
def wf_worker(shop: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    yield from start_worker(shop, "redis", tmp_path_factory.mktemp("workflows"))


def test_a_workflow_is_one_run_with_each_step_once(shop: ModuleType, wf_worker: Worker) -> None:
    run_id = shop.checkout.start(1)
    output = shop.pikku.wait(run_id, timeout=45)
    assert output == {
        "receipt": {"charged": True, "order": {"order": 1, "reserved": True}},
        "token": "tok-1",
        "shipped": "shipped",
    }
    run = wf_worker.store.get_run(run_id)
    assert (run.workflow, run.status, run.graph_hash) == (
        "checkout",
        "completed",
        shop.checkout.version,
    )
    assert run.state == {"receipt.order": 1}
    wf_worker.wait_for_history(
        run_id,
        [
            ("reserve", 1, "succeeded"),
            ("charge", 1, "failed"),
            ("charge", 2, "failed"),
            ("charge", 3, "succeeded"),
            ("token", 1, "succeeded"),
            ("ship", 1, "succeeded"),
        ],
    )
    steps = {s.step_name: s for s in wf_worker.store.list_step_states(run_id)}
    assert steps["charge"].from_step_name == "reserve"
    assert steps["ship"].from_step_name == "token"
    assert steps["token"].rpc_name is None  # an inline step
    version = wf_worker.store.get_workflow_version("checkout", shop.checkout.version)
    assert version is not None and "def checkout" in version.graph["source"]


def test_a_failed_step_can_be_caught_and_compensated(shop: ModuleType, wf_worker: Worker) -> None:
    run_id = shop.refund_flow.start(5)
    assert shop.pikku.wait(run_id, timeout=45) == "compensated: refund"
    wf_worker.wait_for_history(
        run_id,
        [
            ("refund", 1, "failed"),
            ("refund", 2, "failed"),
            ("refund", 3, "failed"),
            ("apologise", 1, "succeeded"),
        ],
    )


def test_do_all_with_one_failing_branch(shop: ModuleType, wf_worker: Worker) -> None:
    run_id = shop.fanout.start(3)
    assert shop.pikku.wait(run_id, timeout=45) == {"failed": "b"}
    states = {s.step_name: s.status for s in wf_worker.store.list_step_states(run_id)}
    assert states == {"a": "succeeded", "b": "failed", "c": "succeeded"}
    froms = {s.step_name: s.from_step_name for s in wf_worker.store.list_step_states(run_id)}
    assert froms == {"a": None, "b": None, "c": None}  # parallel: all follow what came before


def test_a_workflow_failing_for_good_raises_at_wait(shop: ModuleType, wf_worker: Worker) -> None:
    run_id = shop.fragile_flow.start(1)
    with pytest.raises(RunFailed, match="fragile"):
        shop.pikku.wait(run_id, timeout=45)
    run = wf_worker.store.get_run(run_id)
    assert run.error is not None and run.error["step"] == "fragile"


def test_rerun_from_a_middle_step(shop: ModuleType, wf_worker: Worker) -> None:
    run_id = shop.checkout.start(4)
    shop.pikku.wait(run_id, timeout=45)
    assert shop.pikku.rerun(run_id, from_step="token") == ["token", "ship"]
    assert shop.pikku.wait(run_id, timeout=45)["shipped"] == "shipped"
    wf_worker.wait_for_history(
        run_id,
        [
            ("reserve", 1, "succeeded"),
            ("charge", 1, "failed"),
            ("charge", 2, "failed"),
            ("charge", 3, "succeeded"),
            ("token", 1, "succeeded"),
            ("token", 2, "succeeded"),
            ("ship", 1, "succeeded"),
            ("ship", 2, "succeeded"),
        ],
    )
    reasons = [a.reason for a in wf_worker.store.get_run_history(run_id) if a.attempt == 2]
    assert reasons == ["retry", "rerun", "rerun"]


def test_cancel_while_a_step_is_scheduled(shop: ModuleType, wf_worker: Worker) -> None:
    run_id = shop.parked_flow.start()
    wait_until(
        lambda: any(s.step_name == "park" for s in wf_worker.store.list_step_states(run_id)),
        what="the parked step",
    )
    assert shop.pikku.cancel(run_id) == ["park"]
    run = wf_worker.store.get_run(run_id)
    assert run.status == "cancelled"
    assert wf_worker.store.get_step_state(run_id, "park").status == "cancelled"
    assert wf_worker.store.get_step_state(run_id, "first").status == "succeeded"
