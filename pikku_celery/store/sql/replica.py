"""Where a streaming replica's replay is, asked of the replica itself (PostgreSQL only)."""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa

__all__ = ["lag"]

# One row. Not in recovery: the database is a primary, and the rest is NULL. A replica has
# replayed all it received when both positions agree; the age of the last commit it
# replayed says how old what it shows is while it has not. The CASEs keep the recovery
# functions, which fail on a primary, from running there.
lag: Final = sa.text(
    """
    SELECT pg_is_in_recovery() AS in_recovery,
           CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() END AS paused,
           CASE WHEN pg_is_in_recovery()
                THEN pg_last_wal_receive_lsn() IS NOT NULL
                     AND pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
           END AS caught_up,
           CASE WHEN pg_is_in_recovery()
                THEN EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())
           END AS seconds
    """
)
