"""Chords whose header is read from a generator: kept as their tasks are sent.

Celery sends such a header as it reads it, one task ahead, so a long or slow
generator starts running before it ends. Reading it whole to learn the chord's
parts would send nothing until it ended; and the results Celery hands the
backend for it are of copies frozen apart from the tasks it sends, with other
ids. So the parts are the ids of the header's messages, taken as they are
published (``before_task_publish``): a task's own, a chain's last task's, each
naming the chord's group. Celery tells the chord's size before it sends the
last task (``set_chord_size``); the chord is kept as that task is published,
before its message leaves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from celery import signals

__all__ = ["LazyChords"]

_DISPATCH_UID: Final = "pikku_celery.generator_chords"


@dataclass
class _Lazy:
    keep: Callable[[list[str]], None]
    parts: list[str] = field(default_factory=list)
    size: int | None = None


class LazyChords:
    """The chords of this process whose generator header is being sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, _Lazy] = {}
        self._connected = False
        self._uid = f"{_DISPATCH_UID}.{id(self)}"

    def applied(self, group_id: str, keep: Callable[[list[str]], None]) -> None:
        """A chord whose header is a generator: ``keep`` is called with its parts, in the
        order they are sent, when the last is published."""
        with self._lock:
            self._open[group_id] = _Lazy(keep)
            if not self._connected:
                signals.before_task_publish.connect(
                    self._published, weak=False, dispatch_uid=self._uid
                )
                self._connected = True

    def sized(self, group_id: str, size: int) -> None:
        """Celery's count of the chord's parts, told before the last is sent."""
        with self._lock:
            lazy = self._open.get(group_id)
            if lazy is not None:
                lazy.size = size
        self._keep_if_complete(group_id)

    def _published(
        self, headers: Mapping[str, Any] | None = None, body: Any = None, **_: Any
    ) -> None:
        if not self._open or not headers:
            return
        group_id, part = _part_of(headers, body)
        if group_id is None or part is None:
            return
        with self._lock:
            lazy = self._open.get(group_id)
            if lazy is None or part in lazy.parts:
                return
            lazy.parts.append(part)
        self._keep_if_complete(group_id)

    def _keep_if_complete(self, group_id: str) -> None:
        with self._lock:
            lazy = self._open.get(group_id)
            if lazy is None or lazy.size is None or len(lazy.parts) < lazy.size:
                return
            del self._open[group_id]
            if not self._open:
                # Every publish of the process passes this handler: only while it waits.
                signals.before_task_publish.disconnect(dispatch_uid=self._uid)
                self._connected = False
        lazy.keep(lazy.parts)


def _part_of(headers: Mapping[str, Any], body: Any) -> tuple[str | None, str | None]:
    """The group a published message counts in and the task id that counts: the task's
    own, or for the first task of a chain, the chain's last task's (which Celery gives
    the group)."""
    group_id = headers.get("group")
    if group_id:
        return str(group_id), str(headers.get("id"))
    embed = body[2] if isinstance(body, tuple | list) and len(body) == 3 else None
    chain = embed.get("chain") if isinstance(embed, dict) else None
    if not chain or not isinstance(chain[0], dict):
        return None, None
    options = chain[0].get("options") or {}
    last_group, last_id = options.get("group_id"), options.get("task_id")
    if not last_group or not last_id:
        return None, None
    return str(last_group), str(last_id)
