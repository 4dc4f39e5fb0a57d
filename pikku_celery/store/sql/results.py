"""The statements of ``store/results.py``: Celery's view of each task and group."""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.sql.dml import Insert

from pikku_celery.schema import celery_groups as groups
from pikku_celery.schema import celery_result_chord_parts as parts
from pikku_celery.schema import celery_result_chords as chords
from pikku_celery.schema import celery_results as results
from pikku_celery.store.sql.spelling import Among, Upsert

__all__ = [
    "ADDED_PARTS",
    "READY_STATES",
    "add_chord_part",
    "chord_parts_waiting",
    "chords_of_parts",
    "claim_firing",
    "delete_group",
    "delete_result",
    "due_chords",
    "expire_chord_parts",
    "expire_chords",
    "expire_groups",
    "expire_results",
    "get_group",
    "get_result",
    "get_results",
    "grow_chord",
    "insert_chord",
    "insert_chord_parts",
    "lock_chord",
    "mark_sent",
    "notify",
    "part_ids",
    "save_group",
    "settled_chords",
    "unsent_chords",
    "write_result",
]

P = sa.bindparam

#: Celery's ready states: once an attempt is in one, nothing of that attempt changes it.
READY_STATES: Final = ("SUCCESS", "FAILURE", "REVOKED")


def write_result(insert: Upsert) -> Insert:
    """Forward only: a later attempt replaces an earlier one's state; within an attempt a
    ready state is final. A write that names no attempt (``attempt`` NULL: a revoke sent
    from outside the task) is one more write of the row's own attempt."""
    values = insert(results).values(
        task_id=P("task_id"),
        status=P("status"),
        attempt=sa.func.coalesce(P("attempt", type_=sa.Integer), 0),
        meta=P("meta", type_=sa.LargeBinary),
        date_done=P("date_done", type_=results.c.date_done.type),
        updated_at=P("now", type_=results.c.updated_at.type),
    )
    excluded = values.excluded
    not_ready = sa.and_(*(results.c.status != state for state in READY_STATES))
    named = P("attempt", type_=sa.Integer)
    statement: Insert = values.on_conflict_do_update(
        index_elements=["task_id"],
        set_={
            "status": excluded.status,
            "attempt": sa.func.coalesce(named, results.c.attempt),
            "meta": excluded.meta,
            "date_done": excluded.date_done,
            "updated_at": excluded.updated_at,
        },
        where=sa.or_(
            sa.and_(named.is_not(None), excluded.attempt > results.c.attempt),
            sa.and_(
                sa.or_(named.is_(None), excluded.attempt == results.c.attempt),
                not_ready,
            ),
        ),
    )
    return statement


get_result: Final = sa.select(results.c.status, results.c.meta).where(
    results.c.task_id == P("task_id")
)

get_results: Final = sa.select(results.c.task_id, results.c.status, results.c.meta).where(
    results.c.task_id.in_(P("task_ids", expanding=True))
)

delete_result: Final = sa.delete(results).where(results.c.task_id == P("task_id"))


def save_group(insert: Upsert) -> Insert:
    values = insert(groups).values(
        group_id=P("group_id"), meta=P("meta", type_=sa.LargeBinary), updated_at=P("now")
    )
    statement: Insert = values.on_conflict_do_update(
        index_elements=["group_id"],
        set_={"meta": values.excluded.meta, "updated_at": values.excluded.updated_at},
    )
    return statement


get_group: Final = sa.select(groups.c.meta).where(groups.c.group_id == P("group_id"))

delete_group: Final = sa.delete(groups).where(groups.c.group_id == P("group_id"))


# Expiry in batches through the ``updated_at`` index: each statement deletes at most
# ``limit`` rows, so none holds locks for long however large the backlog.
def _oldest(table: sa.Table, key: sa.Column[Any], among: Among) -> sa.ColumnElement[bool]:
    """``key`` is one of the ``limit`` oldest rows written before ``before``."""
    oldest = (
        sa.select(key)
        .where(table.c.updated_at < P("before"))
        .order_by(table.c.updated_at)
        .limit(P("limit"))
        .scalar_subquery()
    )
    return among(key, oldest)


def expire_results(among: Among) -> sa.Delete:
    return sa.delete(results).where(_oldest(results, results.c.task_id, among))


def expire_groups(among: Among) -> sa.Delete:
    return sa.delete(groups).where(_oldest(groups, groups.c.group_id, among))


#: PostgreSQL only: readers LISTENing on the channel are told at COMMIT.
notify: Final = sa.select(sa.func.pg_notify(P("channel"), P("payload")))


# --- chords the backend finishes itself ------------------------------------------


def insert_chord(insert: Upsert) -> Insert:
    """A chord once per apply: the same apply written again (a journal replayed) changes
    nothing; a later apply of a chord that fired (a frozen chord applied again, the same
    group id) is a new run of it, which fires again, as with Celery's Redis backend."""
    values = insert(chords).values(
        group_id=P("group_id"),
        size=P("size"),
        body=P("body", type_=sa.LargeBinary),
        created_at=P("now"),
    )
    excluded = values.excluded
    statement: Insert = values.on_conflict_do_update(
        index_elements=["group_id"],
        set_={
            "size": excluded.size,
            "body": excluded.body,
            "created_at": excluded.created_at,
            "fired_at": None,
            "sent_at": None,
        },
        where=sa.and_(chords.c.fired_at.is_not(None), chords.c.created_at < excluded.created_at),
    )
    return statement


def insert_chord_parts(insert: Upsert) -> Insert:
    statement: Insert = (
        insert(parts)
        .values(group_id=P("group_id"), task_id=P("task_id"), position=P("position"))
        .on_conflict_do_nothing(index_elements=["group_id", "task_id"])
    )
    return statement


#: Where the positions of tasks added to a chord begin: after every header part, even
#: when one is added before its chord's header is in SQL (another process's journal).
ADDED_PARTS: Final = 1 << 30


def add_chord_part(insert: Upsert) -> Insert:
    """A task added to a chord, after its other parts; once, whatever the redeliveries."""
    last = sa.func.coalesce(sa.func.max(parts.c.position), -1)
    after = (
        sa.select(sa.case((last < ADDED_PARTS, ADDED_PARTS), else_=last + 1))
        .where(parts.c.group_id == P("chord_id"))
        .scalar_subquery()
    )
    statement: Insert = (
        insert(parts)
        .from_select(
            ["group_id", "task_id", "position"],
            sa.select(P("chord_id", type_=sa.Text), P("task_id", type_=sa.Text), after),
        )
        .on_conflict_do_nothing(index_elements=["group_id", "task_id"])
        # Says whether it was added: a rowcount of INSERT ... SELECT is not to be trusted.
        .returning(parts.c.task_id)
    )
    return statement


#: The chord waits for one more part (one that was added, not yet fired).
grow_chord: Final = (
    sa.update(chords)
    .where(chords.c.group_id == P("chord_id"), chords.c.fired_at.is_(None))
    .values(size=chords.c.size + 1)
)

chords_of_parts: Final = (
    sa.select(parts.c.group_id)
    .where(parts.c.task_id.in_(P("task_ids", expanding=True)))
    .distinct()
    .order_by(parts.c.group_id)
)


#: The chord's row, locked on PostgreSQL until COMMIT: the batches that write its last
#: results count one after another. SQLite has one writer at a time anyway, and no FOR
#: UPDATE: SQLAlchemy leaves the clause out there.
lock_chord: Final = (
    sa.select(chords.c.size, chords.c.body, chords.c.fired_at)
    .where(chords.c.group_id == P("chord_id"))
    .with_for_update()
)


# Each part counts once, by its row in the results, whatever its deliveries; what the
# chord waits for is its rows of parts, header and added alike, not a count kept apart
# (a task may be added before the chord itself is in SQL).
chord_parts_waiting: Final = (
    sa.select(sa.func.count())
    .select_from(parts.outerjoin(results, results.c.task_id == parts.c.task_id))
    .where(
        parts.c.group_id == P("chord_id"),
        sa.or_(results.c.status.is_(None), results.c.status.not_in(READY_STATES)),
    )
)

claim_firing: Final = (
    sa.update(chords)
    .where(chords.c.group_id == P("chord_id"), chords.c.fired_at.is_(None))
    .values(fired_at=P("now"))
)

part_ids: Final = (
    sa.select(parts.c.task_id).where(parts.c.group_id == P("chord_id")).order_by(parts.c.position)
)

# The chord's parts are all done (a chord not fired, in the statement's snapshot).
_all_parts_done: Final = ~sa.exists(
    sa.select(parts.c.task_id)
    .select_from(parts.outerjoin(results, results.c.task_id == parts.c.task_id))
    .where(
        parts.c.group_id == chords.c.group_id,
        sa.or_(results.c.status.is_(None), results.c.status.not_in(READY_STATES)),
    )
)

#: Chords not fired whose parts all have results, written a while ago: what no batch
#: fired (a safety net: ``settled_chords`` fires them as their batches commit).
due_chords: Final = (
    sa.select(chords.c.group_id)
    .where(chords.c.fired_at.is_(None), chords.c.created_at < P("before"), _all_parts_done)
    .order_by(chords.c.group_id)
    .limit(P("limit"))
)

#: Of the chords named (``group_ids``) or holding one of the parts named (``task_ids``),
#: those not fired whose parts all have results, as a fresh snapshot sees them after a
#: COMMIT: a chord and its last result written by two batches at once, each counting
#: before the other committed, are both in it once the later of the two committed.
settled_chords: Final = (
    sa.select(chords.c.group_id)
    .where(
        chords.c.fired_at.is_(None),
        sa.or_(
            chords.c.group_id.in_(P("group_ids", expanding=True)),
            chords.c.group_id.in_(
                sa.select(parts.c.group_id).where(
                    parts.c.task_id.in_(P("task_ids", expanding=True))
                )
            ),
        ),
        _all_parts_done,
    )
    .order_by(chords.c.group_id)
)

#: Chords fired a while ago whose body the firing process never said it sent.
unsent_chords: Final = (
    sa.select(chords.c.group_id, chords.c.body)
    .where(chords.c.sent_at.is_(None), chords.c.fired_at < P("before"))
    .order_by(chords.c.fired_at)
    .limit(P("limit"))
)

mark_sent: Final = (
    sa.update(chords)
    .where(chords.c.group_id == P("chord_id"), chords.c.sent_at.is_(None))
    .values(sent_at=P("now"))
)

expire_chords: Final = sa.delete(chords).where(
    chords.c.group_id.in_(
        sa.select(chords.c.group_id)
        .where(chords.c.created_at < P("before"))
        .order_by(chords.c.created_at)
        .limit(P("limit"))
        .scalar_subquery()
    )
)

# Parts whose chord has gone (expired above, in the same transaction).
expire_chord_parts: Final = sa.delete(parts).where(
    ~sa.exists().where(chords.c.group_id == parts.c.group_id)
)
