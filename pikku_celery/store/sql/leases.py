"""Statements for leases: take one that is free, renew or release one that is held."""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from pikku_celery.schema import leases

__all__ = ["clock", "generation", "now", "release", "renew", "take", "taken_at"]

P = sa.bindparam


def clock(dialect: str) -> sa.ColumnElement[Any]:
    """Now, in seconds since the epoch: the server's clock on PostgreSQL (one clock for
    every machine of the cluster), the caller's on SQLite (which is on one machine)."""
    if dialect == "postgresql":
        return sa.extract("epoch", sa.func.clock_timestamp())
    return P("now", type_=sa.Float())


@cache
def take(dialect: str) -> Any:
    """Insert the lease, or take it over when it has expired; RETURNING its new generation.

    With ``over_resting`` true, a lease whose holder released it but held it
    back a while (a reaper's rest between passes) can be taken as well. With
    ``if_taken_before`` set, only if nobody took it since that moment.
    """
    insert: Any = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(leases)
    now = clock(dialect)
    statement = insert.values(
        name=P("lease"),
        holder=P("by"),
        generation=1,
        taken_at=now,
        expires_at=now + P("ttl", type_=sa.Float()),
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
                leases.c.expires_at <= now,
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


@cache
def renew(dialect: str) -> sa.Update:
    return (
        sa.update(leases)
        .where(
            leases.c.name == P("lease"),
            leases.c.holder == P("by"),
            leases.c.generation == P("taken"),
        )
        .values(expires_at=clock(dialect) + P("ttl", type_=sa.Float()))
    )


@cache
def release(dialect: str) -> sa.Update:
    """No holder from now on; nobody takes it for ``ttl`` more seconds (unless over a rest)."""
    return renew(dialect).values(holder="")


generation: Final = sa.select(leases.c.generation).where(leases.c.name == P("lease"))
taken_at: Final = sa.select(leases.c.taken_at).where(leases.c.name == P("lease"))


@cache
def now(dialect: str) -> sa.Select[Any]:
    return sa.select(clock(dialect))
