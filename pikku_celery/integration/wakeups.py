"""Result wake-ups on the broker: Redis pub/sub instead of PostgreSQL's NOTIFY.

A reader that cannot LISTEN (through a pooler in transaction mode, or on a database
that relays no notification) polls SQL; one NOTIFY per committed batch also takes an
instance-wide lock on the primary. With ``pikku_result_wakeups = "broker"`` the
process that commits results publishes their ids on the app's Redis broker instead,
and each reading process keeps one subscription, on a thread of its own, that wakes
the readers of those ids. Readers still read committed SQL: a wake-up only says when
to look. While the subscription is away, its watches say they cannot push and
readers poll; after every reconnect each watch is woken once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Final

import redis

from pikku_celery.errors import ConfigurationError
from pikku_celery.store import ResultWatch, WorkflowStore, safe_url

__all__ = [
    "ENV_RESULT_WAKEUPS",
    "WAKEUPS_SETTING",
    "BrokerWakeups",
    "configure_wakeups",
]

logger = logging.getLogger(__name__)

WAKEUPS_SETTING: Final = "pikku_result_wakeups"
ENV_RESULT_WAKEUPS: Final = "PIKKU_RESULT_WAKEUPS"
_CHOICES: Final = ("database", "broker")
#: The channel results are announced on (the same name as PostgreSQL's).
CHANNEL: Final = "pikku_celery_results"
# A larger announcement says "read again, all": readers look, find theirs or not.
_PAYLOAD_LIMIT: Final = 64 * 1024
_RECONNECT: Final = 1.0


def _payload(task_ids: Iterable[str]) -> str:
    payload = ",".join(sorted(set(task_ids)))
    return payload if len(payload) < _PAYLOAD_LIMIT else "*"


class _Woken(ResultWatch):
    def __init__(self, subscriber: _Subscriber, task_ids: frozenset[str]) -> None:
        self._subscriber = subscriber
        self.task_ids = task_ids
        self.event = threading.Event()
        subscriber.add(self)

    @property
    def pushes(self) -> bool:  # type: ignore[override]
        return self._subscriber.healthy

    def wait(self, timeout: float) -> None:
        self.event.wait(max(0.0, timeout))
        self.event.clear()

    def close(self) -> None:
        self._subscriber.remove(self)


class _Subscriber:
    """This process's subscription to the announcements on one Redis, on its own thread."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._watches: set[_Woken] = set()
        self.healthy = False
        self._thread = threading.Thread(target=self._run, name="pikku-celery-wakeups", daemon=True)
        self._thread.start()

    def add(self, watch: _Woken) -> None:
        with self._lock:
            self._watches.add(watch)

    def remove(self, watch: _Woken) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _wake(self, task_ids: frozenset[str] | None) -> None:
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            if task_ids is None or not watch.task_ids.isdisjoint(task_ids):
                watch.event.set()

    def _run(self) -> None:
        stop = threading.Event()  # never set: the thread lives as long as its process
        while True:
            client = redis.Redis.from_url(self._url)
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(CHANNEL)
                # redis-py leaves listen() unannotated.
                for message in pubsub.listen():  # type: ignore[no-untyped-call]
                    if message["type"] == "subscribe":
                        self.healthy = True
                        self._wake(None)  # whatever committed while nobody listened
                    elif message["type"] == "message":
                        data = _text(message["data"])
                        self._wake(None if data == "*" else frozenset(data.split(",")))
            except Exception as exc:  # a cut, a restart: readers poll meanwhile
                logger.info(
                    "pikku-celery's result wake-ups lost the broker %s (%s); waiting readers "
                    "poll until it is back",
                    safe_url(self._url),
                    type(exc).__name__,
                    extra={"action": "result_wakeups_lost"},
                )
            finally:
                self.healthy = False
                self._wake(None)
                pubsub.close()
                client.close()
            stop.wait(_RECONNECT)


def _text(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)


_SUBSCRIBERS: dict[tuple[int, str], _Subscriber] = {}
_SUBSCRIBERS_LOCK = threading.Lock()


def _subscriber(url: str) -> _Subscriber:
    key = (os.getpid(), url)  # a forked child subscribes on a connection of its own
    with _SUBSCRIBERS_LOCK:
        subscriber = _SUBSCRIBERS.get(key)
        if subscriber is None:
            subscriber = _SUBSCRIBERS[key] = _Subscriber(url)
        return subscriber


class BrokerWakeups:
    """Announces committed results on a Redis, and watches for them there."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client = redis.Redis.from_url(url)  # its pool makes connections per process

    def announce(self, task_ids: Sequence[str]) -> None:
        self._client.publish(CHANNEL, _payload(task_ids))

    def watch(self, task_ids: Iterable[str]) -> ResultWatch:
        return _Woken(_subscriber(self.url), frozenset(task_ids))


def _broker_url(conf: Any) -> str:
    configured = conf.get("broker_write_url") or conf.get("broker_url") or ""
    urls = configured if isinstance(configured, list | tuple) else str(configured).split(";")
    first = str(urls[0]).strip() if urls else ""
    if not first.startswith(("redis://", "rediss://", "unix://", "redis+socket://")):
        raise ConfigurationError(
            f"{WAKEUPS_SETTING} = 'broker' ({ENV_RESULT_WAKEUPS}) publishes result wake-ups "
            f"on a Redis broker, and this app's broker is {safe_url(first) or 'not set'}; "
            "use a redis:// broker, or leave the setting at 'database'."
        )
    return first.replace("redis+socket://", "unix://", 1)


def configure_wakeups(conf: Any, store: WorkflowStore) -> None:
    """Make ``store``'s results tell readers on the broker when the app says so
    (``pikku_result_wakeups``, else ``PIKKU_RESULT_WAKEUPS``, else ``"database"``)."""
    choice = conf.get(WAKEUPS_SETTING) or os.environ.get(ENV_RESULT_WAKEUPS) or "database"
    if choice not in _CHOICES:
        raise ConfigurationError(
            f"{WAKEUPS_SETTING} ({ENV_RESULT_WAKEUPS}) is 'database' (PostgreSQL's "
            f"LISTEN/NOTIFY, SQLite's data_version) or 'broker' (Redis pub/sub on the "
            f"app's broker), not {choice!r}."
        )
    if choice == "broker":
        store.results.use_wakeups(BrokerWakeups(_broker_url(conf)))
