"""Publishing alone, with nobody consuming: the step is visible as scheduled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.acceptance.conftest import BROKERS, ROOT, wait_until


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
    assert (state.status, state.retries, state.retry_delay) == ("scheduled", 2, "0s")


def test_a_publisher_that_exits_right_after_delay_leaves_nothing_unwritten(
    shop: ModuleType, tmp_path: Path
) -> None:
    # A minute between flushes: only the flush at exit can have written the step.
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SHOP_BROKER_URL": BROKERS["redis"][0],
        "SHOP_FLUSH_INTERVAL": "60",
        "PIKKU_JOURNAL_DIR": str(tmp_path / "journal"),
    }
    script = (
        "from tests.acceptance import shop\n"
        "result = shop.ship.apply_async(({'order': 9},), queue='nobody-listens-here')\n"
        "print(result.id)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    task_id = done.stdout.split()[-1]
    [attempt] = shop.pikku.store.get_run_history(task_id)  # there already: no waiting
    assert (attempt.step_name, attempt.status) == ("ship", "scheduled")
    assert not list((tmp_path / "journal").glob("*/*.journal"))  # flushed, then removed
