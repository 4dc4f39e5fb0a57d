"""Several apps on one database, and steps sent again where they were first sent.

Two services (the shop, and an app of plain tasks under ``mirror="all"``) write
one PostgreSQL database through their own brokers. A reaper acts only on steps
of tasks its own app has: the other app's settings say nothing of whether
Celery redelivers, and its queues are not where the task's workers listen.
"""

from __future__ import annotations

import importlib
import os
import time
import uuid
from pathlib import Path
from types import ModuleType

from tests.acceptance.conftest import QUEUE, history_of, redis_db, wait_until, worker_running

PLAIN_BROKER = redis_db(13)


def _dir(tmp: Path, name: str) -> Path:
    folder = tmp / name
    folder.mkdir(exist_ok=True)
    return folder


def _plain(pg_url: str) -> ModuleType:
    os.environ.update(
        PLAIN_DATABASE_URL=pg_url,
        PLAIN_QUEUE=QUEUE,
        PLAIN_BROKER_URL=PLAIN_BROKER,
        PLAIN_BACKEND_URL=redis_db(12),
    )
    return importlib.import_module("tests.acceptance.plain_app")


def test_another_apps_reaper_leaves_a_lost_step_to_its_own_app(
    shop: ModuleType, pg_url: str, tmp_path: Path
) -> None:
    plain = _plain(pg_url)
    fast = {"SHOP_VISIBILITY_TIMEOUT": "5", "SHOP_REAPER_INTERVAL": "0"}
    with worker_running(
        plain,
        "redis",
        _dir(tmp_path, "plain"),
        broker_url=PLAIN_BROKER,
        extra_env={"PIKKU_REAPER_INTERVAL": "0.5"},
    ) as other:
        with worker_running(shop, "redis", _dir(tmp_path, "shop"), extra_env=fast) as first:
            result = shop.slow.delay(3)
            wait_until(
                lambda: first.store.get_step_state(result.id, "slow").status == "running",
                what="slow running",
            )
            first.kill_all()
        time.sleep(4)  # several passes of the plain app's reaper
        assert first.store.get_step_state(result.id, "slow").status == "running"
        assert "shop.slow" not in other.log.read_text()
        with worker_running(shop, "redis", _dir(tmp_path, "shop2"), extra_env=fast) as second:
            run = second.wait_for_run(result.id, timeout=60)
            assert (run.status, run.output) == ("completed", "slow done")
            assert history_of(second.store, result.id) == [("slow", 1, "succeeded")]
        assert "shop.slow" not in other.log.read_text()


def test_a_lost_step_is_sent_again_to_the_queue_it_was_first_sent_to(
    shop: ModuleType, tmp_path: Path
) -> None:
    elsewhere = f"shop-elsewhere-{uuid.uuid4().hex[:6]}"
    env = {"SHOP_REAPER_INTERVAL": "0.5"}
    with worker_running(
        shop, "redis", _dir(tmp_path, "a"), extra_env=env, queues=elsewhere
    ) as first:
        # Acked on receipt, so Celery will never deliver it again: the reaper must.
        result = shop.lose_once.apply_async((30,), queue=elsewhere)
        wait_until(
            lambda: first.store.get_step_state(result.id, "lose_once").status == "running",
            what="lose_once running",
        )
        step = first.store.get_step_state(result.id, "lose_once")
        first.kill_all()
    # The next worker listens only where the step was sent, not on the app's default queue.
    with worker_running(
        shop, "redis", _dir(tmp_path, "b"), extra_env=env, queues=elsewhere
    ) as second:
        run = second.wait_for_run(result.id, timeout=60)
        assert (run.status, run.output) == ("completed", "lose_once done")
        assert history_of(second.store, result.id) == [
            ("lose_once", 1, "lost"),
            ("lose_once", 2, "succeeded"),
        ]
    assert step.step_id == result.id
