"""Statements for leases: take one that is free, renew or release one that is held.

Each takes ``clock``, now in seconds since the epoch as the dialect tells it (its
catalogue says which clock, ``store/dialect.py``), so every holder compares with one.
"""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy as sa

from pikku_celery.schema import leases
from pikku_celery.store.sql.spelling import Upsert

__all__ = ["generation", "now", "release", "renew", "take", "taken_at"]

P = sa.bindparam


def take(insert: Upsert, clock: sa.ColumnElement[Any]) -> Any:
    """Insert the lease, or take it over when it has expired; RETURNING its new generation.

    With ``over_resting`` true, a lease whose holder released it but held it
    back a while (a reaper's rest between passes) can be taken as well. With
    ``if_taken_before`` set, only if nobody took it since that moment.

    The clock is read once, in the row's VALUES (``taken_at``): the ON CONFLICT part
    compares with ``excluded.taken_at`` and calls no function, so it holds nothing a
    distributed engine refuses there (a function that is not IMMUTABLE), and the row
    written and the expiry it was compared with are the same instant.
    """
    statement = insert(leases).values(
        name=P("lease"),
        holder=P("by"),
        generation=1,
        taken_at=clock,
        expires_at=clock + P("ttl", type_=sa.Float()),
    )
    excluded = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=["name"],
        set_={
            "holder": excluded.holder,
            "generation": leases.c.generation + sa.literal_column("1", sa.Integer),
            "taken_at": excluded.taken_at,
            "expires_at": excluded.expires_at,
        },
        where=sa.and_(
            sa.or_(
                leases.c.expires_at <= excluded.taken_at,
                sa.and_(
                    sa.cast(P("over_resting", type_=sa.Boolean()), sa.Boolean()),
                    leases.c.holder == sa.literal_column("''", sa.Text),
                ),
            ),
            sa.or_(
                sa.cast(P("if_taken_before", type_=sa.Float()), sa.Float()).is_(None),
                leases.c.taken_at < P("if_taken_before", type_=sa.Float()),
            ),
        ),
    ).returning(leases.c.generation)


def renew(clock: sa.ColumnElement[Any]) -> sa.Update:
    return (
        sa.update(leases)
        .where(
            leases.c.name == P("lease"),
            leases.c.holder == P("by"),
            leases.c.generation == P("taken"),
        )
        .values(expires_at=clock + P("ttl", type_=sa.Float()))
    )


def release(clock: sa.ColumnElement[Any]) -> sa.Update:
    """No holder from now on; nobody takes it for ``ttl`` more seconds (unless over a rest)."""
    return renew(clock).values(holder="")


generation: Final = sa.select(leases.c.generation).where(leases.c.name == P("lease"))
taken_at: Final = sa.select(leases.c.taken_at).where(leases.c.name == P("lease"))


def now(clock: sa.ColumnElement[Any]) -> sa.Select[Any]:
    return sa.select(clock)
