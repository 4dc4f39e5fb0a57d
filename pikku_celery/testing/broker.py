"""``InMemoryBroker``: a Celery app's broker and result backend, in this process, for a while.

The app keeps publishing exactly as it does in production (``before_task_publish``,
protocol-2 messages with their headers, ``after_task_publish``); only the
transport under kombu changes. Each broker has a kombu memory transport of its
own, so the messages of one runner never reach another, or a test that uses
``memory://`` itself.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
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

    def next_message(self, skip: frozenset[str] = frozenset()) -> Any | None:
        """The next message of any queue but ``skip``, taking the queues in turn, or None."""
        names = [name for name in self._queues if name not in skip]
        for offset in range(len(names)):
            name = names[(self._cursor + offset) % len(names)]
            message = self.get(name)
            if message is not None:
                self._cursor = (self._cursor + offset + 1) % len(names)
                return message
        return None

    def waiting(self, skip: frozenset[str] = frozenset()) -> dict[str, int]:
        """How many messages wait, by task name (``?`` for a message that is not a task)."""
        counts: Counter[str] = Counter()
        for name in list(self._queues):
            if name not in skip:
                for payload in _payloads(self._queues[name]):
                    counts[str((payload.get("headers") or {}).get("task") or "?")] += 1
        return dict(counts)


def _payloads(queue: Any) -> Iterator[dict[str, Any]]:
    yield from list(queue.queue)
