"""Publishing alone, with nobody consuming: the step is visible as scheduled."""

from __future__ import annotations

from types import ModuleType

from tests.acceptance.conftest import BROKERS, wait_until


def test_a_task_published_with_no_worker_is_scheduled(shop: ModuleType) -> None:
    shop.app.conf.broker_url = BROKERS["redis"][0]
    shop.app._after_fork()
    result = shop.ship.apply_async(({"order": 3},), queue="nobody-listens-here")
    store = shop.pikku.store
    # Nothing waited for SQL on publish: the step is there within the flush lag.
    wait_until(lambda: store.get_run(result.id), timeout=5, what="the published step")
    run = store.get_run(result.id)
    assert (run.status, run.workflow) == ("running", "shop.ship")
    [attempt] = store.get_run_history(result.id)
    assert (attempt.step_name, attempt.attempt, attempt.status) == ("ship", 1, "scheduled")
    assert attempt.scheduled_at is not None and attempt.running_at is None
    state = store.get_step_state(result.id, "ship")
    assert (state.status, state.retries, state.retry_delay) == ("scheduled", 2, "0")
