"""``pikku-celery demo``: a sample run recorded in the mirror, then shown as tables."""

from __future__ import annotations

from pikku_celery.report import format_history, format_runs
from pikku_celery.store import WorkflowStore


def run_demo(database_url: str, broker_url: str | None = None) -> int:
    store = WorkflowStore(database_url)
    store.init()
    run_id = store.create_run("checkout", {"order": 1}, wire={"type": "demo"})
    previous: str | None = None
    for name, failures in [("reserve", 0), ("charge", 2), ("ship", 0)]:
        step = store.insert_step_state(
            run_id, name, f"shop.{name}", {"order": 1}, retries=3, from_step_name=previous
        )
        store.set_step_scheduled(step.step_id)
        store.set_step_running(step.step_id)
        for attempt in range(failures):
            store.set_step_error(step.step_id, ConnectionError(f"gateway timeout #{attempt + 1}"))
            store.create_retry_attempt(step.step_id, "scheduled")
            store.set_step_running(step.step_id)
        store.set_step_result(step.step_id, {"step": name, "ok": True})
        previous = name
    store.update_run_state(run_id, "receipt.id", "R-1")
    store.update_run_status(run_id, "completed", output={"shipped": True})
    print(format_runs(store.list_runs(limit=5)))
    print()
    print(format_history(store.get_run_history(run_id)))
    print()
    print(f"Recorded in {store!r}; run state: {store.get_run_state(run_id)}")
    store.close()
    return 0
