"""The mirror's own account of its delivery in the benches' processes (``mirror.stats()``).

Each process of a mirrored run (the publisher, the worker's main process and
pool processes) dumps what its mirror appended, wrote, in how many batches and
with what lags, with a mark taken at the timed run's start; the driver sums
the dumps of a run into a ``Delivery``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import signals

from bench.harness.timing import quantile
from pikku_celery import PikkuCelery

__all__ = ["Delivery", "StatsRecorder", "delivery_snapshot", "load_delivery", "wait_written"]


def delivery_snapshot(pikku: PikkuCelery) -> dict[str, Any] | None:
    """What the mirror of this process says of its delivery; None when it cannot say."""
    stats_of = getattr(pikku.mirror, "stats", None)
    if stats_of is None:
        return None
    stats = stats_of()
    return {
        "appended": int(stats.appended),
        "written": int(stats.written),
        "batches": int(stats.batches),
        "lags": [float(lag) for lag in stats.lags],
    }


class StatsRecorder:
    """Dumps this process's delivery stats when it ends, with a mark at the timed run's start.

    The mark is taken in ``task_prerun`` of the process's first task of the
    timed run (the warm-up's run keys end in ``:warm``), so the warm-up's
    events and the first connection stay out of the figures.
    """

    def __init__(self, folder: Path) -> None:
        self.pikku: PikkuCelery | None = None
        self.folder = folder
        self.marks: dict[int, dict[str, Any] | None] = {}

    def snapshot(self) -> dict[str, Any] | None:
        return delivery_snapshot(self.pikku) if self.pikku is not None else None

    def mark(self) -> None:
        if os.getpid() not in self.marks:
            self.marks[os.getpid()] = self.snapshot()

    def on_prerun(self, sender: Any = None, args: Any = None, **_: Any) -> None:
        if os.getpid() in self.marks or not str(getattr(sender, "name", "")).startswith("bench."):
            return
        if args and not str(args[0]).endswith(":warm"):
            self.mark()

    def dump(self, role: str) -> None:
        pid = os.getpid()
        record = {
            "role": role,
            "pid": pid,
            "total": self.snapshot(),
            "mark": self.marks.get(pid),
            "marked": pid in self.marks,
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{role}-{pid}.json").write_text(json.dumps(record))

    def on_received(self, request: Any = None, **_: Any) -> None:
        """A prefork main process runs no task, but writes its pool processes' events: its
        mark is taken when it receives the timed run's first message."""
        if os.getpid() in self.marks or not str(getattr(request, "name", "")).startswith("bench."):
            return
        args = getattr(request, "args", None)
        if args and not str(args[0]).endswith(":warm"):
            self.mark()

    def install_mark(self) -> None:
        """Connected before PikkuCelery's handlers: the mark precedes the task's first event."""
        signals.task_prerun.connect(self.on_prerun, weak=False, dispatch_uid="bench.mark")
        signals.task_received.connect(self.on_received, weak=False, dispatch_uid="bench.mark_main")

    def install_dumps(self, pikku: PikkuCelery) -> None:
        """Connected after PikkuCelery's handlers, so these run after the mirror's own."""
        self.pikku = pikku

        def child(**_: Any) -> None:
            self.dump("child")

        def main(**_: Any) -> None:
            self.dump("main")

        signals.worker_process_shutdown.connect(child, weak=False, dispatch_uid="bench.child")
        signals.worker_shutdown.connect(main, weak=False, dispatch_uid="bench.main")


def wait_written(pikku: PikkuCelery | None, timeout: float = 10.0) -> None:
    """Until this process's mirror has written every event it appended (when it can say)."""
    if pikku is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = delivery_snapshot(pikku)
        if snapshot is None or snapshot["written"] >= snapshot["appended"]:
            return
        time.sleep(0.01)


@dataclass(frozen=True)
class Delivery:
    """The mirror's own account of one timed run, summed over its processes."""

    available: bool
    processes: int
    appended: int = 0
    written: int = 0
    batches: int = 0
    lags: tuple[float, ...] = ()

    def lag(self, q: float) -> float | None:
        return quantile(self.lags, q)


def load_delivery(folder: Path) -> Delivery:
    records = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
    if not records or any(record["total"] is None for record in records):
        return Delivery(False, len(records))
    appended = written = batches = 0
    lags: list[float] = []
    for record in records:
        total, mark = record["total"], record["mark"]
        if mark is None:  # this process saw no task of the timed run
            mark = {"appended": 0, "written": 0, "batches": 0, "lags": []}
        appended += total["appended"] - mark["appended"]
        written += total["written"] - mark["written"]
        batches += total["batches"] - mark["batches"]
        # The lags of the events written since the mark: the newest ones (the mirror may
        # keep only its latest lags, so count from the end).
        since = min(total["written"] - mark["written"], len(total["lags"]))
        lags.extend(total["lags"][len(total["lags"]) - since :] if since > 0 else [])
    return Delivery(True, len(records), appended, written, batches, tuple(lags))
