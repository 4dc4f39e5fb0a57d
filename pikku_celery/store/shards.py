"""Where the store's tables are distributed by key (Citus): the shard each key is on.

Whether they are is read once per connection pool, inside the first batch's transaction
(a process after fork gets a new pool, and reads it again), through the driver's own
cursor: no statement of the store's is added. ``db distribute`` runs before the workers
that write to the coordinator start, or they are restarted after it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Final

import sqlalchemy as sa

from pikku_celery.store import sql

if TYPE_CHECKING:
    from pikku_celery.store.connector import Connector

__all__ = ["CitusShards", "DistributedLayout"]

logger = logging.getLogger(__name__)

_HAS_CITUS: Final = "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"
# The runs' table stands for all: the distributed tables are one co-location group.
_RUNS_DISTRIBUTED: Final = (
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition "
    "WHERE logicalrelid = to_regclass('workflow_runs'))"
)


class DistributedLayout:
    """Whether an engine's database has the store's tables distributed, as the first
    batch of its current pool found it (False until then, and on SQLite)."""

    def __init__(self, engine: sa.Engine, *, distributable: bool) -> None:
        self._engine = engine
        self._read = distributable
        self._found: weakref.WeakKeyDictionary[sa.pool.Pool, bool] = weakref.WeakKeyDictionary()

    @property
    def distributed(self) -> bool:
        return self._found.get(self._engine.pool, False)

    def learn(self, conn: sa.Connection) -> None:
        """Read the layout in ``conn``'s transaction, once per pool."""
        if not self._read or self._engine.pool in self._found:
            return
        with conn.connection.dbapi_connection.cursor() as cursor:  # type: ignore[union-attr]
            cursor.execute(_HAS_CITUS)
            distributed = bool(cursor.fetchone()[0])
            if distributed:
                cursor.execute(_RUNS_DISTRIBUTED)
                distributed = bool(cursor.fetchone()[0])
        self._found[self._engine.pool] = distributed


class CitusShards:
    """The shard of each key, asked of the coordinator (it hashes as its workers do)."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def __call__(self, keys: Collection[str]) -> Mapping[str, int]:
        with self._db.read(None) as conn:
            rows = conn.execute(sql.batches.shards_of_keys, {"keys": list(keys)}).all()
        return {key: int(shard) for key, shard in rows}
