"""Starting and stopping the real ``celery worker`` processes the benchmarks measure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from celery import Celery

__all__ = [
    "BROKER_ENV",
    "DATABASE_ENV",
    "ROOT",
    "clean_env",
    "mirror_failures",
    "run_module",
    "run_module_json",
    "running_worker",
]

#: The project root: workers and helper processes import ``bench.*`` from there.
ROOT: Final = Path(__file__).resolve().parent.parent.parent
READY_TIMEOUT: Final = 60.0
#: What the benches' worker apps read their broker and database from.
BROKER_ENV: Final = "BENCH_BROKER_URL"
DATABASE_ENV: Final = "BENCH_DATABASE_URL"
# Settings a worker's app reads from the environment: left out, so a variable
# set in the caller's shell cannot change what a run measures.
_OWN_PREFIXES: Final = ("BENCH_", "PIKKU_")
# What the mirror logs when a write or a signal handler failed.
_FAILURE_MARKERS: Final = ("pikku-celery could not record", "pikku-celery signal handler")


def clean_env(settings: Mapping[str, str], drop: tuple[str, ...] = _OWN_PREFIXES) -> dict[str, str]:
    """This process's environment without the variables starting with ``drop`` (the bench's
    and pikku's), plus ``settings``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(drop)}
    env.update(settings)
    return env


def _wait_ready(worker: subprocess.Popen[bytes], broker_url: str, log: Path) -> None:
    control = Celery("bench_control", broker=broker_url)
    control.conf.broker_connection_retry_on_startup = True
    deadline = time.monotonic() + READY_TIMEOUT
    try:
        while time.monotonic() < deadline:
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited with {worker.returncode}:\n{log.read_text()}")
            if control.control.ping(timeout=0.5):
                return
        raise SystemExit(f"the worker did not answer a ping within 60 s:\n{log.read_text()}")
    finally:
        control.close()


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is not None:
        return
    # A warm shutdown, so the pool children run their shutdown handlers (the
    # benches read what those write).
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


@contextmanager
def running_worker(
    app_module: str,
    name: str,
    pool: Sequence[str],
    env: Mapping[str, str],
    broker_url: str,
    log: Path,
) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A app_module worker`` answering a ping; stopped warmly afterwards.

    Gossip, mingle and heartbeats are off: they are chatter between workers
    that a lone bench worker does not need and that would land in its figures.
    """
    command = [
        sys.executable, "-m", "celery", "-A", app_module, "worker", *pool,
        "-l", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"{name}@%h",
    ]  # fmt: skip
    with log.open("ab") as output:
        worker = subprocess.Popen(
            command,
            cwd=ROOT,
            env=dict(env),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_ready(worker, broker_url, log)
        yield worker
    finally:
        _stop(worker)


def run_module(module: str, args: Sequence[str], env: Mapping[str, str]) -> str:
    """Run ``python -m module args`` to its end in ``env``; its standard output."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{module} {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def run_module_json(module: str, args: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    """Run ``python -m module args`` to its end; the JSON report its last line prints."""
    report: dict[str, Any] = json.loads(run_module(module, args, env).strip().splitlines()[-1])
    return report


def mirror_failures(log: Path, *also: str) -> list[str]:
    """The worker log's lines saying a mirror write or a signal handler failed (or ``also``)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    markers = (*_FAILURE_MARKERS, *also)
    return [line for line in text.splitlines() if any(marker in line for marker in markers)]
