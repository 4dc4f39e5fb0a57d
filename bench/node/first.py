"""The start of a drain: a run's first task, and the CPU counters at that moment.

A drain is timed from its first task, so the CPU it cost must be read then
too. The driver cannot: it is inside the worker's start-up (waiting for the
worker to answer a ping) while the worker already drains. A thread started
before the worker waits for the first stamp ``bench.node.app`` pushes and
reads ``/proc`` at once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import redis

from bench.harness.cpu import cpu_snapshot
from bench.node.app import first_key
from bench.node.threads import SIDE_THREADS, side_threads_cpu

__all__ = ["FirstTask", "Start"]


@dataclass(frozen=True)
class Start:
    #: When the run's first task started (the worker's clock, as the done stamp).
    time: float
    worker_pid: int
    cpu: dict[str, float]


class FirstTask:
    """Waits in a thread for ``run``'s first task; :meth:`wait` returns what it saw."""

    def __init__(self, client: redis.Redis, run: str, databases: Collection[str]) -> None:
        self._client = client
        self._run = run
        self._databases = tuple(databases)
        self._stop = threading.Event()
        self._start: Start | None = None
        self._thread = threading.Thread(target=self._watch, name="node-bench-first", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            # Short blocking calls, so stop() ends the thread within a second.
            answer: Any = self._client.blpop([first_key(self._run)], timeout=1)
            if answer is not None:
                stamp = json.loads(answer[1])
                cpu = cpu_snapshot(int(stamp["worker"]), self._databases)
                cpu[SIDE_THREADS] = side_threads_cpu(int(stamp["worker"]))
                self._start = Start(float(stamp["time"]), int(stamp["worker"]), cpu)
                return

    def wait(self, timeout: float) -> Start:
        """The first task's stamp; the earliest of every pool process's, which may have
        started theirs within the same instant."""
        self._thread.join(timeout)
        if self._start is None:
            raise SystemExit(f"{self._run}: no task started within {timeout:.0f} s")
        others: Any = self._client.lrange(first_key(self._run), 0, -1)
        earliest = min([self._start.time, *(json.loads(item)["time"] for item in others)])
        return Start(earliest, self._start.worker_pid, self._start.cpu)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
