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
    "UNNAMED",
    "add_chord_part",
    "chord_parts_waiting",
    "claim_firing",
    "delete_group",
    "delete_result",
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
    "mark_and_lock_chord_pg",
    "mark_done_among",
    "mark_sent",
    "notify",
    "open_chords",
    "part_ids",
    "parts_waiting_for",
    "ready_results",
    "save_group",
    "unsent_chords",
    "unsettled_chords",
    "waiting_parts",
    "write_result",
]

P = sa.bindparam

# The parts of a chord a statement looks at beside the parts it selects.
_others = parts.alias("others")

#: Celery's ready states: once an attempt is in one, nothing of that attempt changes it.
READY_STATES: Final = ("SUCCESS", "FAILURE", "REVOKED")

#: The attempt of a result row written by no attempt (a revoke sent from outside the task)
#: before any attempt wrote one: attempts count from 1.
UNNAMED: Final = 0

# The same constants written into a statement as SQL literals, not sent as parameters:
# what an ON CONFLICT part compares with is then plain SQL, which a distributed engine
# plans without typing a parameter (and an executemany can carry).
_UNNAMED_SQL: Final = sa.literal_column("0", sa.Integer)
_READY_SQL: Final = (
    sa.literal_column("'SUCCESS'", sa.Text),
    sa.literal_column("'FAILURE'", sa.Text),
    sa.literal_column("'REVOKED'", sa.Text),
)


def write_result(insert: Upsert) -> Insert:
    """Forward only: a later attempt replaces an earlier one's state; within an attempt a
    ready state is final. A write that names no attempt (``attempt`` NULL: a revoke sent
    from outside the task) is one more write of the row's own attempt.

    The attempt a write names is in its row (0 when it names none: attempts count from
    1), so the ON CONFLICT part reads only the stored row and ``excluded``, no parameter:
    a distributed engine plans it whatever the types of the values."""
    values = insert(results).values(
        task_id=P("task_id"),
        status=P("status"),
        attempt=sa.func.coalesce(P("attempt", type_=sa.Integer), UNNAMED),
        meta=P("meta", type_=sa.LargeBinary),
        date_done=P("date_done", type_=results.c.date_done.type),
        updated_at=P("now", type_=results.c.updated_at.type),
    )
    excluded = values.excluded
    not_ready = sa.and_(*(results.c.status != state for state in _READY_SQL))
    unnamed = excluded.attempt == _UNNAMED_SQL
    statement: Insert = values.on_conflict_do_update(
        index_elements=["task_id"],
        set_={
            "status": excluded.status,
            "attempt": sa.case((unnamed, results.c.attempt), else_=excluded.attempt),
            "meta": excluded.meta,
            "date_done": excluded.date_done,
            "updated_at": excluded.updated_at,
        },
        where=sa.or_(
            excluded.attempt > results.c.attempt,
            sa.and_(sa.or_(unnamed, excluded.attempt == results.c.attempt), not_ready),
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
            "fired_at": sa.null(),
            "sent_at": sa.null(),
        },
        where=sa.and_(chords.c.fired_at.is_not(None), chords.c.created_at < excluded.created_at),
    )
    return statement


def insert_chord_parts(insert: Upsert) -> Insert:
    """A chord's parts, not done: the transaction marks those whose results are in
    (``mark_done_among``) once it has read them, a part whose result came first included."""
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

#: The parts not yet done whose tasks are these (results just written): the one look by
#: task id (the parts' index on it), since a result does not know its chord.
parts_waiting_for: Final = (
    sa.select(parts.c.group_id, parts.c.task_id)
    .where(parts.c.task_id.in_(P("task_ids", expanding=True)), sa.not_(parts.c.done))
    .order_by(parts.c.group_id, parts.c.task_id)
)

#: Of these chords, those not fired, each with the parts it still waits for (none: one
#: row, its task NULL). A chord and its parts share their key, the group id: the join
#: stays on it.
waiting_parts: Final = (
    sa.select(chords.c.group_id, parts.c.task_id)
    .select_from(
        chords.outerjoin(
            parts, sa.and_(parts.c.group_id == chords.c.group_id, sa.not_(parts.c.done))
        )
    )
    .where(chords.c.group_id.in_(P("group_ids", expanding=True)), chords.c.fired_at.is_(None))
    .order_by(chords.c.group_id, parts.c.task_id)
)

#: Of these tasks, those with a ready result (each looked up by its own key).
ready_results: Final = sa.select(results.c.task_id).where(
    results.c.task_id.in_(P("task_ids", expanding=True)), results.c.status.in_(READY_STATES)
)


#: A part's result is ready (one of ``task_ids``): it counts from now on, once, whatever its
#: deliveries. Named by the chord's key.
mark_done_among: Final = (
    sa.update(parts)
    .where(
        parts.c.group_id == P("chord_id"),
        parts.c.task_id.in_(P("task_ids", expanding=True)),
        sa.not_(parts.c.done),
    )
    .values(done=sa.true())
)

#: The chord's row, locked on PostgreSQL until COMMIT: the batches that write its last
#: results count one after another. SQLite has one writer at a time anyway, and no FOR
#: UPDATE: SQLAlchemy leaves the clause out there.
lock_chord: Final = (
    sa.select(chords.c.size, chords.c.body, chords.c.fired_at)
    .where(chords.c.group_id == P("chord_id"))
    .with_for_update()
)


#: PostgreSQL only: ``mark_done_among`` and ``lock_chord`` in one statement, one round trip
#: (the parts' rows and the chord's are on one key, the group id). SQLite has no UPDATE in
#: a WITH, and one writer at a time: it sends the two.
mark_and_lock_chord_pg: Final = lock_chord.add_cte(
    mark_done_among.returning(parts.c.task_id).cte("marked")
)


# What the chord waits for is its rows of parts, header and added alike, not a count kept
# apart (a task may be added before the chord itself is in SQL); each counts once, by its
# flag, whatever its deliveries.
chord_parts_waiting: Final = (
    sa.select(sa.func.count())
    .select_from(parts)
    .where(parts.c.group_id == P("chord_id"), sa.not_(parts.c.done))
)

claim_firing: Final = (
    sa.update(chords)
    .where(chords.c.group_id == P("chord_id"), chords.c.fired_at.is_(None))
    .values(fired_at=P("now"))
)

part_ids: Final = (
    sa.select(parts.c.task_id).where(parts.c.group_id == P("chord_id")).order_by(parts.c.position)
)

#: The chords not fired holding a part of ``task_ids`` (results a transaction wrote, now
#: committed) that may be done though no transaction claimed them: the part is not marked
#: (it and its result landed at once, each transaction blind to the other's row), or the
#: chord waits for nothing (it landed at once with the part's mark). Their parts are
#: checked against the results before any is marked or fired. The chord and its parts
#: share a key (the group id): the join and the subquery stay on it.
unsettled_chords: Final = (
    sa.select(parts.c.group_id)
    .join(chords, chords.c.group_id == parts.c.group_id)
    .where(
        parts.c.task_id.in_(P("task_ids", expanding=True)),
        chords.c.fired_at.is_(None),
        sa.or_(
            sa.not_(parts.c.done),
            ~sa.exists(
                sa.select(_others.c.task_id).where(
                    _others.c.group_id == parts.c.group_id, sa.not_(_others.c.done)
                )
            ),
        ),
    )
    .distinct()
    .order_by(parts.c.group_id)
)

#: Chords not fired, written before ``before``, in group id order from ``after`` on: what
#: the reaper looks at again, ``limit`` at a time (a pass begins where the last one ended,
#: so chords that wait long do not hide the others).
open_chords: Final = (
    sa.select(chords.c.group_id)
    .where(
        chords.c.fired_at.is_(None),
        chords.c.created_at < P("before"),
        chords.c.group_id > P("after"),
    )
    .order_by(chords.c.group_id)
    .limit(P("limit"))
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
