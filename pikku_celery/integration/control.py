"""What every worker with pikku-celery holds: the reaper's view of the cluster.

A worker answers ``pikku_held`` with three things about the task ids it is
asked of: those it has (running, reserved, or waiting on an ETA); those
whose events still wait in the journals on its machine, so an attempt that
ended a moment ago but is not in SQL yet is never taken for lost; and when
its main process started, so an attempt that began before then under the
same worker name is known to have died with an earlier process of it (a
restarted worker).

Only workers with pikku-celery are asked: every worker on the broker hears a
broadcast, and one of another app (without the command) logs "No such control
command" with a traceback for each. So the view starts with a ``ping``, which
every worker answers; a worker not yet known to have pikku-celery is asked once
which tasks it has (``registered``: pikku-celery's own ``pikku_celery.*`` tasks
say it is installed), and ``pikku_held`` goes to the known ones by name.
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
# The app PikkuCelery installs registers tasks of this prefix (its reaper's, at least).
_OUR_TASKS: Final = "pikku_celery."
# Workers seen with pikku-celery, by node name: asked once, then addressed directly. A
# name not seen to have it is asked again each time (it may restart with pikku-celery).
_pikku_workers: set[str] = set()


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
    """Pings, then asks the workers with pikku-celery; a worker that does not answer within
    ``timeout`` is not in the view."""
    view = ClusterView()
    # A connection of its own, with a socket timeout: a pooled Redis connection used
    # from this thread could be left with a blocking read that never returns (seen
    # as a reaper pass hung for good), and no read may outlast the broadcast by much.
    bounded = {"socket_timeout": timeout + _READ_SLACK, "socket_connect_timeout": _CONNECT}
    with app.connection_for_write(transport_options=bounded) as connection:
        pongs = app.control.ping(timeout=timeout, connection=connection)
        alive = sorted({nodename for reply in pongs or () for nodename in reply})
        # A worker of an app without pikku-celery: alive, and holding none of ours.
        view.workers.update(dict.fromkeys(alive))
        ours = _with_pikku(app, alive, timeout, connection)
        if not ours:
            return view
        replies = app.control.broadcast(
            HELD_COMMAND,
            arguments={"ids": task_ids},
            reply=True,
            timeout=timeout,
            connection=connection,
            destination=ours,
            limit=len(ours),
        )
    answered: set[str] = set()
    for reply in replies or ():
        for nodename, answer in reply.items():
            if not isinstance(answer, dict) or "held" not in answer:
                continue
            answered.add(nodename)
            view.held.update(answer.get("held") or ())
            view.journaled.update(answer.get("journaled") or ())
            since = answer.get("since")
            view.workers[nodename] = float(since) if isinstance(since, int | float) else None
    # Asked again next time (a worker restarted under its name, without pikku-celery).
    _pikku_workers.difference_update(set(ours) - answered)
    return view


def _with_pikku(app: Celery, alive: list[str], timeout: float, connection: Any) -> list[str]:
    """Those of ``alive`` with pikku-celery installed: asked once per worker name."""
    unknown = [nodename for nodename in alive if nodename not in _pikku_workers]
    if unknown:
        inspect = app.control.inspect(
            destination=unknown, timeout=timeout, connection=connection, limit=len(unknown)
        )
        for nodename, names in (inspect.registered() or {}).items():
            if any(str(name).startswith(_OUR_TASKS) for name in names or ()):
                _pikku_workers.add(nodename)
    return [nodename for nodename in alive if nodename in _pikku_workers]
