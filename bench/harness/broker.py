"""The Redis server the benches use as Celery's broker."""

from __future__ import annotations

import os
from typing import Final

import redis

__all__ = ["DEFAULT_REDIS_URL", "REDIS_URL_ENV", "flush", "redis_client", "require_empty"]

REDIS_URL_ENV: Final = "PIKKU_BENCH_REDIS_URL"
DEFAULT_REDIS_URL: Final = os.environ.get(REDIS_URL_ENV) or "redis://127.0.0.1:6379/13"

_clients: dict[tuple[int, str], redis.Redis] = {}


def redis_client(url: str) -> redis.Redis:
    """One client per process: a forked pool child must not share its parent's socket."""
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(url)
    return client


def flush(url: str) -> None:
    """Empty the bench's Redis database, so no run sees another's messages or counters."""
    redis_client(url).flushdb()


def require_empty(url: str) -> None:
    """Refuse a Redis database that holds anything: the bench flushes it before every run,
    and on a shared server it may be someone else's."""
    keys = redis_client(url).dbsize()
    if keys:
        raise SystemExit(
            f"{url} holds {keys} keys; the bench flushes its database, so it wants an "
            "empty one: pass another --redis-url (or flush it, if it is the bench's own)"
        )
