"""Leases in SQL: work that one process of a whole cluster does at a time.

A lease is a row with a holder and an expiry. Taking it is one guarded
upsert (free or expired: yours, with the next generation), so any number
of processes on any number of machines agree on one holder; a holder that
dies simply lets it expire. ``generation`` tells a waiter whether a pass
began after it looked: recovery at a worker's start uses that to join a
pass instead of repeating it.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

from pikku_celery.errors import ConfigurationError
from pikku_celery.store import sql
from pikku_celery.store.connector import Connector

__all__ = ["Leases"]


class Leases:
    """Leases: one holder at a time across every process on every machine."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def take_lease(
        self,
        name: str,
        holder: str,
        ttl: float,
        *,
        over_resting: bool = False,
        if_taken_before: float | None = None,
        conn: sa.Connection | None = None,
    ) -> int | None:
        """The lease's new generation if ``holder`` has it now for ``ttl`` seconds, else None.

        ``over_resting``: take it too when its last holder released it with a ``hold``.
        ``if_taken_before``: only if nobody took it since that moment (on
        :meth:`lease_clock`), so a check and a take are one step.
        """
        if ttl <= 0:
            raise ConfigurationError(f"A lease lasts more than 0 seconds, not {ttl}.")
        if not holder:
            raise ConfigurationError("A lease's holder needs a name.")
        params = {
            "lease": name,
            "by": holder,
            "ttl": float(ttl),
            "now": time.time(),
            "over_resting": over_resting,
            "if_taken_before": if_taken_before,
        }
        with self._db.write(conn) as c:
            got = c.execute(self._db.sql.take_lease, params).scalar()
        return None if got is None else int(got)

    def renew_lease(
        self,
        name: str,
        holder: str,
        generation: int,
        ttl: float,
        *,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Extend the lease ``ttl`` seconds from now; False if ``holder`` lost it meanwhile."""
        return self._held_lease(self._db.sql.renew_lease, name, holder, generation, ttl, conn)

    def release_lease(
        self,
        name: str,
        holder: str,
        generation: int,
        *,
        hold: float = 0.0,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Give the lease up, at once or after ``hold`` more seconds; False if not held."""
        return self._held_lease(self._db.sql.release_lease, name, holder, generation, hold, conn)

    def _held_lease(
        self,
        statement: sa.Update,
        name: str,
        holder: str,
        generation: int,
        ttl: float,
        conn: sa.Connection | None,
    ) -> bool:
        params = {
            "lease": name,
            "by": holder,
            "taken": generation,
            "ttl": float(ttl),
            "now": time.time(),
        }
        with self._db.write(conn) as c:
            return bool(c.execute(statement, params).rowcount)

    def lease_generation(self, name: str, *, conn: sa.Connection | None = None) -> int:
        """How many times the lease was ever taken (0: never)."""
        with self._db.read(conn) as c:
            got = c.execute(sql.leases.generation, {"lease": name}).scalar()
        return 0 if got is None else int(got)

    def lease_taken_at(self, name: str, *, conn: sa.Connection | None = None) -> float | None:
        """When the lease was last taken, on :meth:`lease_clock`; None: never."""
        with self._db.read(conn) as c:
            got = c.execute(sql.leases.taken_at, {"lease": name}).scalar()
        return None if got is None else float(got)

    def lease_clock(self, *, conn: sa.Connection | None = None) -> float:
        """Now on the clock leases are kept by: the server's on PostgreSQL, this machine's on
        SQLite (seconds since the epoch)."""
        with self._db.read(conn) as c:
            return float(c.execute(self._db.sql.lease_clock, {"now": time.time()}).scalar_one())
