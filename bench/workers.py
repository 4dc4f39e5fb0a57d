"""Starting and stopping the real Celery workers the benchmarks measure."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from celery import Celery

__all__ = ["stop_worker", "wait_ready"]


def wait_ready(worker: subprocess.Popen[bytes], broker_url: str, log: Path) -> None:
    control = Celery("bench_control", broker=broker_url)
    control.conf.broker_connection_retry_on_startup = True
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited with {worker.returncode}:\n{log.read_text()}")
            if control.control.ping(timeout=0.5):
                return
        raise SystemExit(f"the worker did not answer a ping within 60 s:\n{log.read_text()}")
    finally:
        control.close()


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is not None:
        return
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
