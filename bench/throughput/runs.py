"""One run of the Celery benchmark: what it measured, and what the mirror recorded of it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bench.harness.cpu import PARTS
from bench.harness.delivery import Delivery
from bench.throughput.app import WARMUP_TASKS


@dataclass(frozen=True)
class Run:
    scenario: str
    variant: str
    pool: str
    tasks: int
    elapsed: float
    worker_elapsed: float
    publish: float
    cpu: dict[str, float]
    #: SQL commits in the scenario's PostgreSQL database over the worker's life.
    commits: int | None = None
    delivery: Delivery | None = None
    check: str | None = None

    @property
    def rate(self) -> float:
        return self.tasks / self.elapsed

    @property
    def settle(self) -> float:
        """How long after the worker's last task SQL showed every step succeeded."""
        return self.elapsed - self.worker_elapsed

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds per task the bench's own processes spent (not "other")."""
        own = sum(self.cpu.get(name, 0.0) for name in PARTS if name != "other")
        return own / self.tasks * 1000

    @property
    def ceiling(self) -> float:
        """Tasks per second with every CPU busy on this work alone: robust to outside load."""
        return (os.cpu_count() or 1) * 1000 / self.cpu_ms if self.cpu_ms else 0.0

    @property
    def commits_per_task(self) -> float | None:
        # The worker also ran the warm-up tasks.
        return None if self.commits is None else self.commits / (self.tasks + WARMUP_TASKS)

    @property
    def batches_per_task(self) -> float | None:
        if self.delivery is None or not self.delivery.available:
            return None
        return self.delivery.batches / self.tasks
