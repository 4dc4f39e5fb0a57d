"""``InMemoryBroker``: a Celery app's broker and result backend, in this process, for a while.

The app keeps publishing exactly as it does in production (``before_task_publish``,
protocol-2 messages with their headers, ``after_task_publish``); only the
transport under kombu changes. Each broker has a kombu memory transport of its
own, so the messages of one runner never reach another, or a test that uses
``memory://`` itself.

A message with an ETA is taken off its queue and held, as a worker holds it in
its timer, until the time it is asked for (the runner's clock) reaches the ETA.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from typing import Any, Final

from celery import Celery
from celery.backends.cache import CacheBackend
from kombu import Connection, pools
from kombu.transport import memory, virtual

__all__ = ["InMemoryBroker"]

# What the runner changes in the app's configuration, each put back as it was.
_SETTINGS: Final = (
    "broker_url",
    "broker_read_url",
    "broker_write_url",
    "broker_transport",
    "broker_transport_options",
    "task_always_eager",
)


def _transport() -> type[virtual.Transport]:
    """A memory transport class with queues of its own (kombu's are one global state)."""
    channel = type("InlineChannel", (memory.Channel,), {"events": defaultdict(set), "queues": {}})
    return type(
        "InlineTransport",
        (memory.Transport,),
        {"Channel": channel, "global_state": virtual.BrokerState()},
    )


class InMemoryBroker:
    """Points ``app`` at an in-memory broker and result backend until :meth:`detach`.

    Celery's connection and producer pools are made on first use and cached on
    the app, so they are dropped on the way in and on the way out: messages go
    to this broker while it is attached and to the configured one afterwards.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.transport = _transport()
        self._queues: dict[str, Any] = self.transport.Channel.queues  # type: ignore[attr-defined]
        self._saved: dict[str, Any] = {}
        self._saved_backend: Any = None
        self._connection: Connection | None = None
        self._cursor = 0
        # (eta, order, message): the order keeps messages of one ETA in the order they came.
        self._held: list[tuple[dt.datetime, int, Any]] = []
        self._order = itertools.count()

    # --- attach and detach ------------------------------------------------------------

    def attach(self) -> None:
        app = self.app
        conf = app.conf
        self._saved = {key: conf[key] for key in _SETTINGS}
        conf.update(
            broker_url="memory://localhost/",
            broker_read_url=None,
            broker_write_url=None,
            # A transport class wins over the scheme of any URL (and CELERY_BROKER_URL).
            broker_transport=self.transport,
            broker_transport_options={},
            # Eager calls would skip the publish signals, and so the steps' first events.
            task_always_eager=False,
        )
        self._drop_app_pools()
        # A result backend on the network (Redis, a database) would be reached by every
        # task that stores its result, and by chords; one in memory answers instead.
        self._saved_backend = app._backend_cache  # type: ignore[attr-defined]
        app._backend_cache = CacheBackend(app=app, backend="memory://")  # type: ignore[attr-defined]
        self._connection = app.connection_for_read()
        self._connection.default_channel  # noqa: B018 - connects now, not in the first get

    def detach(self) -> None:
        app = self.app
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._forget_pools()
        self._drop_app_pools()
        app._backend_cache = self._saved_backend  # type: ignore[attr-defined]
        app.conf.update(self._saved)
        self._queues.clear()
        self._held.clear()

    def _drop_app_pools(self) -> None:
        self.app._pool = None  # type: ignore[attr-defined]
        self.app.amqp._producer_pool = None  # type: ignore[attr-defined]

    def _forget_pools(self) -> None:
        """Close kombu's process-wide pools of this broker's connections, and forget them."""
        for group in (pools.producers, pools.connections):
            for key, pool in list(group.items()):
                template = getattr(pool, "connection", None) or getattr(
                    getattr(pool, "connections", None), "connection", None
                )
                if getattr(template, "transport_cls", None) is self.transport:
                    pool.force_close_all()
                    # The group's keys are hashes already; its __delitem__ would hash again.
                    dict.__delitem__(group, key)

    # --- messages -----------------------------------------------------------------------

    @property
    def channel(self) -> Any:
        if self._connection is None:
            raise RuntimeError("The in-memory broker is not attached.")
        return self._connection.default_channel

    def declare(self, queue: Any) -> None:
        """Declare a kombu queue (and bind it) on this broker."""
        queue(self.channel).declare()

    def get(self, queue: str) -> Any | None:
        """The next message of one queue, or None."""
        return self.channel.basic_get(queue)

    def next_message(self, now: dt.datetime, skip: frozenset[str] = frozenset()) -> Any | None:
        """The next message due at ``now`` of any queue but ``skip``, or None.

        Held messages whose ETA has come go first, earliest ETA first; then the
        queues, taken in turn. A queued message whose ETA is after ``now`` is
        held on the way. None means every queue is empty.
        """
        if self._held and self._held[0][0] <= now:
            return heapq.heappop(self._held)[2]
        names = [name for name in self._queues if name not in skip]
        for offset in range(len(names)):
            name = names[(self._cursor + offset) % len(names)]
            while (message := self.get(name)) is not None:
                eta = self._eta(message.headers)
                if eta is not None and eta > now:
                    heapq.heappush(self._held, (eta, next(self._order), message))
                    continue
                self._cursor = (self._cursor + offset + 1) % len(names)
                return message
        return None

    def next_eta(self) -> dt.datetime | None:
        """The earliest ETA of the messages held (None: none is), once the queues are empty."""
        return self._held[0][0] if self._held else None

    def waiting(self, now: dt.datetime, skip: frozenset[str] = frozenset()) -> dict[str, int]:
        """How many messages are due at ``now``, by task name (``?``: not a task)."""
        counts: Counter[str] = Counter()
        for name in list(self._queues):
            if name not in skip:
                for payload in _payloads(self._queues[name]):
                    headers = payload.get("headers") or {}
                    eta = self._eta(headers)
                    if eta is None or eta <= now:
                        counts[_task_name(headers)] += 1
        for eta, _, message in self._held:
            if eta <= now:
                counts[_task_name(message.headers or {})] += 1
        return dict(counts)

    def _eta(self, headers: Mapping[str, Any] | None) -> dt.datetime | None:
        value = (headers or {}).get("eta")
        if not value:
            return None
        moment = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(value)
        # Celery sends aware ETAs; a naive one is in the app's timezone, as a worker reads it.
        return moment if moment.tzinfo else moment.replace(tzinfo=self.app.timezone)


def _payloads(queue: Any) -> Iterator[dict[str, Any]]:
    yield from list(queue.queue)


def _task_name(headers: Mapping[str, Any]) -> str:
    return str(headers.get("task") or "?")
