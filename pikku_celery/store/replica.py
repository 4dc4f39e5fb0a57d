"""How far a read replica is behind its primary, as the replica itself tells it.

The faces (dashboard, CLI, metrics) may read on a streaming replica; what they show is
then as old as the replica's replay. This is what they say about it, and what a lookup
that found nothing adds to its message: a run the primary has may not be replayed yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from pikku_celery.store.connector import Connector

__all__ = ["ReplicaLag", "Replication"]


@dataclass(frozen=True, slots=True)
class ReplicaLag:
    """A replica's replay: caught up with what it received from its primary, or behind.

    ``seconds``: the age of the last commit it replayed, while it is behind (None before
    it replayed any since it started); ``paused``: someone paused its replay
    (``pg_wal_replay_pause()``).
    """

    caught_up: bool
    paused: bool
    seconds: float | None

    def describe(self) -> str:
        """One clause for a message: "is 12.3 s behind the primary", and why when known."""
        if self.caught_up:
            return "has replayed everything it received from the primary"
        behind = (
            f"is {self.seconds:.1f} s behind the primary"
            if self.seconds is not None
            else "is behind the primary"
        )
        if self.paused:
            behind += " (its replay is paused; pg_wal_replay_resume() on it resumes it)"
        return behind


class Replication:
    """Asks the database whether it is a replica, and how far behind."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def lag(self, *, conn: sa.Connection | None = None) -> ReplicaLag | None:
        """The replica's lag; None when the database is not a replica (a primary, SQLite)."""
        statement = self._db.sql.replica_lag
        if statement is None:
            return None
        with self._db.read(conn) as c:
            row = c.execute(statement).one()
        if not row.in_recovery:
            return None
        return ReplicaLag(
            caught_up=bool(row.caught_up),
            paused=bool(row.paused),
            seconds=None if row.seconds is None else max(0.0, float(row.seconds)),
        )
