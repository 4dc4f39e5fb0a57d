"""What every worker holds, asked in one broadcast: the reaper's view of the cluster.

A worker answers ``pikku_held`` with three things about the task ids it is
asked of: those it has (running, reserved, or waiting on an ETA); those
whose events still wait in the journals on its machine, so an attempt that
ended a moment ago but is not in SQL yet is never taken for lost; and when
its main process started, so an attempt that began before then under the
same worker name is known to have died with an earlier process of it (a
restarted worker).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from celery import Celery
from celery.worker import control as worker_control
from celery.worker.control import inspect_command

from pikku_celery.mirror import journaled_steps

__all__ = ["HELD_COMMAND", "ClusterView", "ask", "register", "worker_started"]

HELD_COMMAND: Final = "pikku_held"
_READ_SLACK: Final = 5.0
_CONNECT: Final = 5.0

_started: list[float] = [time.time()]


def worker_started() -> None:
    """Called when this process becomes a worker: attempts before now are not its own."""
    _started[0] = time.time()


@dataclass(slots=True)
class ClusterView:
    """The answers of one broadcast."""

    held: set[str] = field(default_factory=set)
    journaled: set[str] = field(default_factory=set)
    #: Every worker that answered, with when its main process started (None: unknown).
    workers: dict[str, float | None] = field(default_factory=dict)


def register(journal_folders: Callable[[Celery], Iterable[Path]]) -> None:
    """Teach this process's workers the command (Celery keeps control commands per process)."""

    def pikku_held(state: Any, ids: Any = None, **_: Any) -> dict[str, Any]:
        wanted = [str(task_id) for task_id in (ids or ())]
        waiting: set[str] = set()
        for folder in journal_folders(state.app):
            waiting |= journaled_steps(folder, wanted)
        return {
            "held": sorted(worker_control.query_task(state, wanted)),  # type: ignore[attr-defined]
            "journaled": sorted(waiting),
            "since": _started[0],
        }

    inspect_command(name=HELD_COMMAND, variadic="ids", signature="[id1 [id2 [...]]]")(pikku_held)


def ask(app: Celery, task_ids: list[str], timeout: float) -> ClusterView:
    """One broadcast; a worker that does not answer within ``timeout`` is not in the view."""
    view = ClusterView()
    # A connection of its own, with a socket timeout: a pooled Redis connection used
    # from this thread could be left with a blocking read that never returns (seen
    # as a reaper pass hung for good), and no read may outlast the broadcast by much.
    bounded = {"socket_timeout": timeout + _READ_SLACK, "socket_connect_timeout": _CONNECT}
    with app.connection_for_write(transport_options=bounded) as connection:
        replies = app.control.broadcast(
            HELD_COMMAND,
            arguments={"ids": task_ids},
            reply=True,
            timeout=timeout,
            connection=connection,
        )
    for reply in replies or ():
        for nodename, answer in reply.items():
            if not isinstance(answer, dict) or "held" not in answer:
                # A worker of an app without pikku-celery: alive, and holding none of ours.
                view.workers[nodename] = None
                continue
            view.held.update(answer.get("held") or ())
            view.journaled.update(answer.get("journaled") or ())
            since = answer.get("since")
            view.workers[nodename] = float(since) if isinstance(since, int | float) else None
    return view
