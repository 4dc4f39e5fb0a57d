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
    """
    statement = insert(leases).values(
        name=P("lease"),
        holder=P("by"),
        generation=1,
        taken_at=clock,
        expires_at=clock + P("ttl", type_=sa.Float()),
    )
    return statement.on_conflict_do_update(
        index_elements=["name"],
        set_={
            "holder": statement.excluded.holder,
            "generation": leases.c.generation + 1,
            "taken_at": statement.excluded.taken_at,
            "expires_at": statement.excluded.expires_at,
        },
        where=sa.and_(
            sa.or_(
                leases.c.expires_at <= clock,
                sa.and_(
                    sa.cast(P("over_resting", type_=sa.Boolean()), sa.Boolean()),
                    leases.c.holder == "",
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
