"""The app the node bench's workers load: the Celery bench's scenario app, plus a first-task stamp.

``celery -A bench.node.app worker`` builds the same app as ``bench.throughput.app``
(the scenario named in the environment, its no-op and retry-once tasks, the
Redis counter of finished tasks) and adds one thing: the first task of a run
that each pool process starts pushes the time and the worker's main process
id onto a Redis list. A drain is timed from the first of those, so the
worker's start-up (imports, forking the pool) is left out of its rate, and the
bench reads the CPU counters of the worker's processes at that moment.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Final

from celery import signals

from bench.harness.broker import redis_client
from bench.throughput.app import bench_app

__all__ = ["app", "first_key"]

_STAMPED: Final[set[tuple[int, str]]] = set()


def first_key(run: str) -> str:
    return f"{run}:first"


def _stamp_first(sender: Any = None, args: Any = None, **_: Any) -> None:
    """Once per pool process and run: one Redis call per process, not per task, so the
    stamp costs both modes the same and next to nothing."""
    if not args or not str(getattr(sender, "name", "")).startswith("bench."):
        return
    run = str(args[0])
    if (os.getpid(), run) in _STAMPED:
        return
    _STAMPED.add((os.getpid(), run))
    # A prefork pool process's parent is the worker's main process: the bench needs
    # its pid to read the CPU of the worker's processes when the drain starts.
    stamp = {"time": time.time(), "worker": os.getppid()}
    redis_client(sender.app.conf.broker_url).rpush(first_key(run), json.dumps(stamp))


signals.task_prerun.connect(_stamp_first, weak=False, dispatch_uid="bench.node.first")

#: What ``celery -A bench.node.app`` loads (None when no scenario is set).
app = bench_app.app if bench_app is not None else None
