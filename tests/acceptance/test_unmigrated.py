"""A live worker on a database whose tables are missing: an outage, not poison.

Its events stay in the journal (none set aside), it says what to run once a
minute instead of a traceback per batch, and once ``pikku-celery db upgrade``
has run they are written within seconds.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

from pikku_celery import WorkflowStore
from tests.acceptance.conftest import QUEUE, ROOT, redis_db, wait_until, worker_running
from tests.conftest import PgServer

BROKER_URL = redis_db(13)


def publish_elsewhere(*args: int) -> str:
    """From a process without pikku-celery, as another service would."""
    code = (
        "import sys; from celery import Celery; "
        f"r = Celery(broker={BROKER_URL!r}).send_task('plain.add', {args!r}, queue={QUEUE!r}); "
        "print(r.id)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.strip()


def test_events_wait_for_db_upgrade_and_are_written_after_it(
    pg_server: PgServer, tmp_path: Path
) -> None:
    empty = pg_server.create_database()  # no tables: `db upgrade` never ran
    os.environ.setdefault("PLAIN_QUEUE", QUEUE)
    os.environ.setdefault("PLAIN_BROKER_URL", BROKER_URL)
    plain = importlib.import_module("tests.acceptance.plain_app")
    worker_env = {
        "PLAIN_DATABASE_URL": empty,
        "PLAIN_QUEUE": QUEUE,
        "PLAIN_BROKER_URL": BROKER_URL,
        "PIKKU_JOURNAL_DIR": str(tmp_path / "journal"),
    }
    with worker_running(
        plain, "redis", tmp_path, concurrency=1, broker_url=BROKER_URL, extra_env=worker_env
    ) as worker:
        log = worker.log
        ids = [publish_elsewhere(n, n) for n in range(5)]
        # Each task ran (the mirror never holds a task up) and its events wait.
        time.sleep(3)
        text = log.read_text()
        assert text.count("succeeded in") >= 5
        assert "set aside" not in text
        assert "run `pikku-celery db upgrade`" in text
        assert text.count("Traceback") == 0
        upgrade = subprocess.run(
            [sys.executable, "-m", "pikku_celery", "--database-url", empty, "db", "upgrade"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert upgrade.returncode == 0, upgrade.stderr
        store = WorkflowStore(empty)
        try:

            def all_completed() -> bool:
                return all(store.get_run(task_id).status == "completed" for task_id in ids)

            wait_until(all_completed, timeout=20, what="the runs written after the upgrade")
            outputs = sorted(store.get_run(task_id).output for task_id in ids)
            assert outputs == [0, 2, 4, 6, 8]
        finally:
            store.close()
        assert "set aside" not in log.read_text()
