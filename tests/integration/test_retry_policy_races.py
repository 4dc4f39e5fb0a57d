"""The retries a step gets reach its row however late the retry's event is written.

With ``countdown=0`` the next attempt often starts, in another pool process, before the
retry handler's event is written; the policy that event carries still applies. A retry
written after the step failed for good never revives its retries.
"""

from __future__ import annotations

from pikku_celery.store import WorkflowStore
from tests.support.transitions import fail, retry, schedule, start, succeed


def test_a_retry_written_after_the_next_attempt_started_still_sets_the_retries(
    store: WorkflowStore,
) -> None:
    run_id = store.create_run("lone", {})
    step_id = schedule(store, run_id, "flaky", retries=0)
    start(store, step_id, 1)
    start(store, step_id, 2)  # the next attempt's start is written first
    retry(store, step_id, 1, ConnectionError("busy"), retries=5, retry_delay=0)
    state = store.get_step_state(run_id, "flaky")
    assert (state.status, state.attempt_count, state.retries) == ("running", 2, 5)
    assert state.retry_delay_seconds == 0.0
    succeed(store, step_id, 2, "done")
    state = store.get_step_state(run_id, "flaky")
    assert (state.status, state.retries, state.result) == ("succeeded", 5, "done")


def test_a_retry_written_after_the_step_failed_for_good_does_not_revive_it(
    store: WorkflowStore,
) -> None:
    run_id = store.create_run("lone", {})
    step_id = schedule(store, run_id, "refund", retries=1)
    start(store, step_id, 1)
    start(store, step_id, 2)
    fail(store, step_id, 2, ValueError("refused"))  # gave up: no retries remain
    retry(store, step_id, 1, ValueError("refused"), retries=1, retry_delay=0)  # late
    state = store.get_step_state(run_id, "refund")
    assert (state.status, state.attempt_count, state.retries) == ("failed", 2, 1)
    assert state.attempt_count >= (state.retries or 0) + 1  # Pikku counts it failed
