"""``pikku-celery demo``: a real worker runs a sample workflow; the mirror shows what happened.

By default everything is embedded: the SQLite mirror and kombu's filesystem
broker in a temporary folder, so no server is needed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pikku_celery.render.text import format_history, format_runs
from pikku_celery.store import SETTLED_RUN_STATUSES, WorkflowStore

__all__ = ["run_demo"]

TIMEOUT_SECONDS = 90.0


def _wait_settled(store: WorkflowStore, run_ids: list[str], deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            if all(store.get_run(run_id).status in SETTLED_RUN_STATUSES for run_id in run_ids):
                return True
        except LookupError:
            pass  # the worker has not recorded the lone task yet
        time.sleep(0.2)
    return False


def run_demo(database_url: str, broker_url: str | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="pikku-demo-") as folder:
        os.environ.update(
            PIKKU_DATABASE_URL=database_url,
            PIKKU_DEMO_FOLDER=folder,
            PIKKU_DEMO_BROKER_URL=broker_url or "",
            PIKKU_DEMO_QUEUE=f"pikku-demo-{os.getpid()}",
        )
        from celery import chain

        # kombu warns that a filesystem URL has no host; that is expected here.
        logging.getLogger("kombu.connection").setLevel(logging.ERROR)

        from pikku_celery.demo import app as demo_app

        store = demo_app.pikku.store
        store.init()
        print(f"mirror: {store!r}; broker: {broker_url or 'filesystem (temporary folder)'}")
        log = Path(folder) / "worker.log"
        with log.open("wb") as log_file:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "pikku_celery.demo.app",
                    "worker",
                    "--pool=prefork",
                    "--concurrency=2",
                    "--loglevel=warning",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=os.environ.copy(),
            )
            try:
                checkout = demo_app.pikku.run(
                    chain(demo_app.reserve.s(1), demo_app.charge.s(), demo_app.ship.s()),
                    name="checkout",
                    input={"order": 1},
                )
                refund = demo_app.refund.delay(2).id
                settled = _wait_settled(
                    store, [checkout, refund], time.monotonic() + TIMEOUT_SECONDS
                )
            finally:
                worker.terminate()
                worker.wait(timeout=30)
        if not settled:
            print(
                f"The demo runs did not finish within {TIMEOUT_SECONDS:.0f}s; the worker said:\n"
                + log.read_text()[-3000:],
                file=sys.stderr,
            )
            return 1
        runs = [store.get_run(checkout), store.get_run(refund)]
        print()
        print(format_runs(runs))
        for run in runs:
            print(f"\n{run.workflow} ({run.run_id}): {run.status}")
            print(format_history(store.get_run_history(run.run_id)))
        store.close()
        return 0
