"""Statements for writes that name their attempt: the shape events from Celery take.

Events come late, twice and out of order from several processes, so every
statement here is safe to apply in any order: an attempt's status only moves
forward, and the step row only follows its newest attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.dml import Insert, Update

from pikku_celery.schema import chords
from pikku_celery.schema import workflow_runs as runs
from pikku_celery.schema import workflow_step as steps
from pikku_celery.schema import workflow_step_history as history
from pikku_celery.store.models import STATUS_RANK
from pikku_celery.store.sql.runs import STEP_COLUMNS
from pikku_celery.store.sql.spelling import Parameter, Upsert

__all__ = [
    "ATTEMPT_CONSTRAINT",
    "ATTEMPT_KEY",
    "TIMESTAMP_COLUMN",
    "Source",
    "add_next_attempt",
    "all_steps_succeeded",
    "attempt_upsert",
    "attempt_values",
    "complete_run_if_done",
    "completion",
    "inline_text",
    "insert_attempt",
    "insert_run_once",
    "last_result",
    "ranked_below",
    "record_attempt",
    "record_attempt_pg",
    "record_attempt_rows",
    "record_attempt_step",
    "retry_attempt_pg",
    "retry_attempt_sqlite",
    "run_of_step",
    "schedule_attempt",
    "schedule_step",
    "schedule_step_pg",
    "settle_run",
    "step_moves",
    "step_policy",
    "step_run",
    "step_values",
    "still_going",
    "touch_run",
]

P = sa.bindparam

# The attempt column each status stamps.
TIMESTAMP_COLUMN: Final[dict[str, str | None]] = {
    "pending": None,
    "scheduled": "scheduled_at",
    "running": "running_at",
    "succeeded": "succeeded_at",
    "failed": "failed_at",
    "cancelled": "failed_at",
}


def ranked_below(column: sa.ColumnElement[Any], status: str) -> sa.ColumnElement[bool]:
    """The column's status ranks below ``status`` (``STATUS_RANK``), spelled as the statuses
    it rules out: short SQL (a batch statement holds it many times), nothing to evaluate.

    The statuses are written into the SQL, not bound: Citus cannot type a bound parameter
    inside ``ON CONFLICT DO UPDATE`` of an ``INSERT ... SELECT``."""
    at_or_above = [name for name, order in STATUS_RANK.items() if order >= STATUS_RANK[status]]
    return sa.and_(*(column != inline_text(name) for name in at_or_above))


# The constants these statements compare with, written into their SQL text.
_INLINE: Final[Mapping[str, sa.ColumnElement[Any]]] = {
    "pending": sa.literal_column("'pending'", sa.Text),
    "scheduled": sa.literal_column("'scheduled'", sa.Text),
    "lost": sa.literal_column("'lost'", sa.Text),
    "running": sa.literal_column("'running'", sa.Text),
    "succeeded": sa.literal_column("'succeeded'", sa.Text),
    "failed": sa.literal_column("'failed'", sa.Text),
    "cancelled": sa.literal_column("'cancelled'", sa.Text),
    "true": sa.literal_column("'true'", sa.Text),
}
_ZERO: Final = sa.literal_column("0", sa.Integer)


def inline_text(value: str) -> sa.ColumnElement[Any]:
    """A status (or ``'true'``) written into the statement's text, not bound."""
    return _INLINE[value]


insert_attempt: Final = sa.insert(history)
_TERMINAL: Final = ("succeeded", "failed", "cancelled")

#: The unique key of an attempt row: its run first (revision 0013).
ATTEMPT_KEY: Final = ["workflow_run_id", "workflow_step_id", "attempt"]
#: That key by name, as PostgreSQL's upserts name it: the partitioned layout keeps the name
#: and adds the partition key (``run_day``) to it, and an ``ON CONSTRAINT`` target holds on
#: either layout where a column list would have to name the columns of one.
ATTEMPT_CONSTRAINT: Final = "workflow_step_history_step_attempt_unique"
_EXECUTION_COLUMNS: Final = ("task_id", "worker", "pid", "eta")
_WHERE_IT_RAN: Final = ("worker", "pid")


def _cast(name: str, type_: Any) -> sa.ColumnElement[Any]:
    # In INSERT ... SELECT, PostgreSQL needs each parameter's type spelled out.
    return sa.cast(P(name), type_)


def _typed(name: str, column: sa.Column[Any]) -> sa.ColumnElement[Any]:
    return _cast(name, column.type)


# --- publishing -----------------------------------------------------------------


def insert_run_once(insert: Upsert) -> Insert:
    """A run of its own for a lone task; a second publish of it changes nothing.

    No conflict target, here and in every ``DO NOTHING`` of a run-keyed table: the
    partitioned layout's keys add the run's day, and any key the row repeats means the
    row is there."""
    statement: Insert = insert(runs).on_conflict_do_nothing()
    return statement


_parent = steps.alias("parent")
# The step a new step follows is named by id: its name is whatever it got in
# its run (``add#2``), read when the follower is written.
_parent_name = (
    sa.select(_parent.c.step_name)
    .where(
        # A step follows a step of its own run (the publishing task's).
        _parent.c.workflow_run_id == P("run_id", type_=sa.Text()),
        _parent.c.workflow_step_id == P("parent_step_id", type_=sa.Text()),
    )
    .scalar_subquery()
)


def schedule_step(insert: Upsert, typed: Parameter) -> Insert:
    """Insert a step under the first free name: ``name``, then ``name#2``, ``name#3``...

    Nothing is written when the step id exists already (a retry republishes
    its message with the same id). RETURNING tells the two outcomes apart.
    ``typed`` spells each parameter of the SELECT with its type, the dialect's way.
    """
    taken = (
        sa.select(sa.func.count())
        .where(
            steps.c.workflow_run_id == P("run_id"),
            sa.or_(
                steps.c.step_name == P("base_name"),
                steps.c.step_name.like(P("name_pattern"), escape="\\"),
            ),
        )
        .scalar_subquery()
    )
    name = sa.case(
        (taken == 0, sa.cast(P("base_name"), sa.Text)),
        else_=sa.cast(P("base_name"), sa.Text) + "#" + sa.cast(taken + 1, sa.Text),
    )

    values: dict[str, Any] = {
        "workflow_step_id": typed("step_id", sa.Text()),
        "workflow_run_id": typed("run_id", sa.Text()),
        "step_name": name,
        "rpc_name": typed("rpc_name", sa.Text()),
        "data": typed("data", steps.c.data.type),
        "status": sa.literal("scheduled", sa.Text),
        "retries": typed("retries", sa.Integer()),
        "retry_delay": typed("retry_delay", sa.Text()),
        "from_step_name": sa.func.coalesce(typed("from_step_name", sa.Text()), _parent_name),
        "current_attempt": sa.literal(1, sa.Integer),
        "routing": typed("routing", steps.c.routing.type),
        "created_at": typed("now", steps.c.created_at.type),
        "updated_at": typed("now", steps.c.updated_at.type),
        "run_day": typed("run_day", steps.c.run_day.type),
    }
    # SQLite needs a WHERE in INSERT ... SELECT ... ON CONFLICT to parse it.
    select = sa.select(*values.values()).where(sa.true())
    statement: Insert = (
        insert(steps)
        .from_select(list(values), select)
        .on_conflict_do_nothing()
        .returning(steps.c.step_name, steps.c.workflow_step_id)
    )
    return statement


@cache
def schedule_step_pg(with_run: bool) -> sa.Select[Any]:
    """PostgreSQL: run (if new), step and first attempt in one statement, one round trip.

    The foreign keys are checked at the end of the statement, when the run
    written by the first CTE exists.
    """
    step = schedule_step(postgresql.insert, _cast).cte("step")
    attempt_values: dict[str, Any] = {
        "history_id": _typed("history_id", history.c.history_id),
        "workflow_run_id": _typed("run_id", history.c.workflow_run_id),
        "workflow_step_id": step.c.workflow_step_id,
        "attempt": sa.literal(1, sa.Integer),
        "status": sa.literal("scheduled", sa.Text),
        "created_at": _typed("now", history.c.created_at),
        "scheduled_at": _typed("now", history.c.scheduled_at),
        "eta": _typed("eta", history.c.eta),
        "task_id": _typed("task_id", history.c.task_id),
        "reason": sa.literal("first", sa.Text),
        "run_day": _typed("run_day", history.c.run_day),
    }
    attempt = sa.insert(history).from_select(
        list(attempt_values), sa.select(*attempt_values.values()).select_from(step)
    )
    query = sa.select(step.c.step_name)
    if with_run:
        run = (
            postgresql.insert(runs)
            .values(
                workflow_run_id=P("run_id"),
                workflow=P("run_workflow"),
                status="running",
                input=P("run_input"),
                state="{}",
                wire=P("run_wire"),
                created_at=P("now"),
                updated_at=P("now"),
                run_day=P("run_day"),
            )
            .on_conflict_do_nothing()
        )
        query = query.add_cte(run.cte("run"))
    return query.add_cte(attempt.cte("attempt"))


def schedule_attempt(insert: Upsert) -> Insert:
    values = insert(history).values(
        history_id=P("history_id"),
        workflow_run_id=P("run_id"),
        workflow_step_id=P("step_id"),
        attempt=1,
        status="scheduled",
        created_at=P("now"),
        scheduled_at=P("now"),
        eta=P("eta"),
        task_id=P("task_id"),
        reason="first",
        run_day=P("run_day"),
    )
    statement: Insert = values.on_conflict_do_nothing()
    return statement


# --- attempt-addressed transitions ------------------------------------------------


#: Where a transition's values come from: bound parameters (one event), or the
#: columns of a set of rows (a whole batch in one statement).
Source = Callable[[str], Any]


def _bound(name: str) -> Any:
    return P(name)


def step_values(status: str, v: Source = _bound) -> dict[str, Any]:
    """The step row after the event: all of it when the event moves the step (see
    :func:`step_moves`); only the retry policy when that alone applies (:func:`step_policy`)."""
    moves = step_moves(status, v)
    moving_on = sa.func.coalesce(steps.c.current_attempt, 1) < v("attempt_no")

    # Each value keeps its column's type inside CASE: a time is written in the stored
    # format (SQLite), a parameter gets the column's cast (PostgreSQL).
    def if_moves(value: Any, column: str) -> Any:
        kind = steps.c[column].type
        return sa.type_coerce(
            sa.case((moves, sa.type_coerce(value, kind)), else_=steps.c[column]), kind
        )

    def policy(name: str) -> Any:
        kind = steps.c[name].type
        carried = sa.func.coalesce(sa.type_coerce(v(name), kind), steps.c[name])
        return sa.type_coerce(sa.case((step_policy(status, v), carried), else_=steps.c[name]), kind)

    values: dict[str, Any] = {
        "status": if_moves(sa.literal(status, sa.Text), "status"),
        "current_attempt": if_moves(v("attempt_no"), "current_attempt"),
        "updated_at": if_moves(v("now"), "updated_at"),
        # What the step gets from now on, when the event says (a retry, a final failure).
        "retries": policy("retries"),
        "retry_delay": policy("retry_delay"),
    }
    result: Any
    error: Any
    if status == "succeeded":
        result, error = v("result"), sa.null()
    elif status in _TERMINAL:
        result, error = sa.null(), v("error")
    else:  # a new attempt starts clean; the same attempt keeps what it has
        result = sa.case((moving_on, sa.null()), else_=steps.c.result)
        error = sa.case((moving_on, sa.null()), else_=steps.c.error)
    values.update(result=if_moves(result, "result"), error=if_moves(error, "error"))
    return values


def step_moves(status: str, v: Source = _bound) -> sa.ColumnElement[bool]:
    """The step row follows attempt K only if K is its newest attempt and K moves forward."""
    current = sa.func.coalesce(steps.c.current_attempt, 1)
    return sa.or_(
        current < v("attempt_no"),
        sa.and_(current == v("attempt_no"), ranked_below(steps.c.status, status)),
    )


def step_policy(status: str, v: Source = _bound) -> sa.ColumnElement[bool]:
    """The retries and delay an event carries apply to the step from its attempt on, even
    when the step has moved past the event's status: a retry's next attempt often starts
    before the retry handler's event is written. Never to a step that failed for good at
    that attempt, unless the event is that failure (a late retry must not revive it)."""
    current = sa.func.coalesce(steps.c.current_attempt, 1)
    # Typed: alone in IS NOT NULL, PostgreSQL could not tell a bound parameter's type.
    carried = sa.or_(
        sa.cast(v("retries"), sa.Integer).is_not(None),
        sa.cast(v("retry_delay"), sa.Text).is_not(None),
    )
    if status == "failed":
        reached = current <= v("attempt_no")
    else:
        reached = sa.or_(
            current < v("attempt_no"),
            sa.and_(current == v("attempt_no"), steps.c.status != "failed"),
        )
    return sa.and_(carried, reached)


@cache
def record_attempt_step(status: str) -> Update:
    """The step row's half of a transition (see ``_step_moves``), on the step's run
    (``run_id``)."""
    return (
        sa.update(steps)
        .where(
            steps.c.workflow_run_id == run_of_step,
            steps.c.workflow_step_id == P("step_id"),
            sa.or_(step_moves(status), step_policy(status)),
        )
        .values(**step_values(status))
    )


_STAMPS: Final = ("scheduled_at", "running_at")

# The run of the step an event names: the event's own when it knows it (the mirror's
# batches), else the operation looks it up first (``step_run``) for a direct caller that
# names only the step. Never a subquery in the statement itself: Citus refuses one in a
# COALESCE of a write, and a statement that names its run goes to that run's shard alone.
run_of_step: Final = P("run_id", type_=sa.Text())

#: The run of a step found by its id alone: one look before a write, for a caller that
#: names only the step (the batches know each step's run and never send it).
step_run: Final = (
    sa.select(steps.c.workflow_run_id).where(steps.c.workflow_step_id == P("step_id")).limit(1)
)


def attempt_values(status: str, v: Source) -> dict[str, Any]:
    """The attempt row an event writes, each value from ``v``: a batch's set of rows, or
    typed parameters of one event. Not its run's day: the caller knows where that is (a
    batch's rows carry it; one event reads it from its step's row)."""
    stamp = TIMESTAMP_COLUMN[status]
    values: dict[str, Any] = {
        "history_id": v("history_id"),
        "workflow_run_id": v("run_id"),
        "workflow_step_id": v("step_id"),
        "attempt": v("attempt_no"),
        "status": sa.literal(status, sa.Text),
        "created_at": v("now"),
        "task_id": v("task_id"),
        "worker": v("worker"),
        "pid": v("pid"),
        "eta": v("eta"),
        "reason": v("reason"),
        # Each start of an attempt is one delivery of its message.
        "delivery_count": v("deliveries"),
    }
    for column in _STAMPS:
        values[column] = v(column)
    if status in _TERMINAL and stamp is not None:
        values[stamp] = v("ended_at")
    if status == "succeeded":
        values["result"] = v("result")
    elif status in _TERMINAL:
        values["error"] = v("error")
    return values


def attempt_upsert(insert: Any, status: str) -> Insert:
    """What an event does to an attempt row that exists: only ever move it forward."""
    stamp = TIMESTAMP_COLUMN[status]
    ended = stamp if status in _TERMINAL else None
    excluded = insert.excluded
    forward = ranked_below(history.c.status, status)
    if status == "running":
        # A lost attempt moves on to running only with a delivery counted now (a redelivery):
        # the same start written again (the journal of a worker killed between its COMMIT
        # and its checkpoint, adopted after the reaper gave the attempt up) leaves it lost.
        forward = sa.and_(
            forward,
            sa.or_(history.c.status != inline_text("lost"), excluded.delivery_count > _ZERO),
        )

    def if_forward(column: str) -> sa.ColumnElement[Any]:
        return sa.case((forward, excluded[column]), else_=history.c[column])

    updates: dict[str, Any] = {
        "status": if_forward("status"),
        "delivery_count": history.c.delivery_count + excluded.delivery_count,
        "reason": sa.func.coalesce(history.c.reason, excluded.reason),
    }
    # A late "scheduled" or "running" still fills in when that happened; an
    # outcome's time is only written with the outcome itself.
    for column in _STAMPS:
        updates[column] = sa.func.coalesce(history.c[column], excluded[column])
    # A redelivery (a start counted as one more delivery, later than the one the row holds,
    # of an attempt not ended yet) moves the start on, as it moves where the attempt ran:
    # the row describes its last delivery, so what the attempt took is the execution that
    # ends it, not the killed one before it too; ``delivery_count`` tells it was redelivered.
    redelivered = sa.and_(
        excluded.delivery_count > _ZERO,
        excluded.running_at > history.c.running_at,
        history.c.succeeded_at.is_(None),
        history.c.failed_at.is_(None),
    )
    updates["running_at"] = sa.case((redelivered, excluded.running_at), else_=updates["running_at"])
    if ended is not None:
        updates[ended] = sa.func.coalesce(history.c[ended], if_forward(ended))
    if status in _TERMINAL:
        updates["result"] = (
            if_forward("result")
            if status == "succeeded"
            else sa.case((forward, sa.null()), else_=history.c.result)
        )
        updates["error"] = (
            if_forward("error")
            if status != "succeeded"
            else sa.case((forward, sa.null()), else_=history.c.error)
        )
    # A start no later than the one the row holds is a delivery that ended long ago, written
    # late (a killed pool child's journal, adopted after its redelivery was written), or the
    # first start written again (a journal replayed): the row keeps where it ran last.
    late_start = sa.and_(
        excluded.running_at.is_not(None),
        history.c.running_at.is_not(None),
        excluded.running_at <= history.c.running_at,
    )
    for column in _EXECUTION_COLUMNS:
        # A later delivery runs somewhere else: the row says where it ran last.
        latest = sa.func.coalesce(excluded[column], history.c[column])
        updates[column] = (
            sa.case((late_start, history.c[column]), else_=latest)
            if column in _WHERE_IT_RAN
            else latest
        )
    statement: Insert = (
        insert.on_conflict_do_update(constraint=ATTEMPT_CONSTRAINT, set_=updates)
        if isinstance(insert, postgresql.Insert)
        else insert.on_conflict_do_update(index_elements=ATTEMPT_KEY, set_=updates)
    )
    return statement


# The type of each parameter of one event's attempt row, which INSERT ... SELECT spells.
_EVENT_TYPES: Final[Mapping[str, Any]] = {
    "history_id": history.c.history_id.type,
    "run_id": history.c.workflow_run_id.type,
    "step_id": history.c.workflow_step_id.type,
    "attempt_no": history.c.attempt.type,
    "now": history.c.created_at.type,
    "scheduled_at": history.c.scheduled_at.type,
    "running_at": history.c.running_at.type,
    "ended_at": history.c.failed_at.type,
    "result": history.c.result.type,
    "error": history.c.error.type,
    "task_id": history.c.task_id.type,
    "worker": history.c.worker.type,
    "pid": history.c.pid.type,
    "eta": history.c.eta.type,
    "reason": history.c.reason.type,
    "deliveries": history.c.delivery_count.type,
}


@cache
def record_attempt(insert: Upsert, typed: Parameter, status: str) -> Insert:
    """Upsert attempt K's row (after :func:`record_attempt_step`, in one transaction).

    One statement records one event, or several events of the same attempt
    coalesced (``scheduled_at``/``running_at`` and the outcome's ``ended_at``
    each keep the time of their own event; ``deliveries`` is how many starts
    it counts). Selected beside its step's row, by the step's key: the row takes the
    run's day from it, and nothing is written for a step that is not there (the
    caller tells that from the count of rows).
    """

    def read(name: str) -> Any:
        return typed(name, _EVENT_TYPES[name])

    values = attempt_values(status, read)
    values["run_day"] = steps.c.run_day
    select = sa.select(*values.values()).where(
        steps.c.workflow_run_id == run_of_step, steps.c.workflow_step_id == P("step_id")
    )
    return attempt_upsert(insert(history).from_select(list(values), select), status)


@cache
def record_attempt_rows(insert: Upsert, status: str) -> Insert:
    """:func:`record_attempt` for rows that carry their run's day (a batch's, whose one read
    found each step): plain VALUES, no read of the step."""
    values = attempt_values(status, _bound) | {"run_day": P("run_day")}
    return attempt_upsert(insert(history).values(**values), status)


@cache
def record_attempt_pg(status: str) -> Insert:
    """:func:`record_attempt` with the step row's update riding along: one round trip."""
    statement = record_attempt(postgresql.insert, _cast, status)
    return statement.add_cte(record_attempt_step(status).cte("step"))


# --- run outcome ----------------------------------------------------------------

# Spelled without IN: these statements are sent as SQL compiled once, which
# cannot hold an expanding IN list.
_still_going = sa.or_(runs.c.status == "running", runs.c.status == "suspended")

still_going: Final = _still_going

touch_run: Final = (
    sa.update(runs).where(runs.c.workflow_run_id == P("run_id")).values(updated_at=P("now"))
)


def completion(among: Any = None, on_days: Callable[[Any], Any] | None = None) -> tuple[Any, Any]:
    """The completion check of a run row and its output, reading only that run's rows.

    ``among``: the runs a statement names (a bound parameter), named again in every
    subquery, so a distributed database runs them on those runs' shards only (where each
    is tied to the run row alone, it runs them on every shard). ``on_days``: the condition
    on a table's ``run_day`` that names the days of those runs, in every subquery too, so
    the partitioned layout reads only those days' partitions.

    ``(all_steps_succeeded, last_result)``: every step of the run has succeeded and no
    chord of it waits for its body (whether a chord's body is written, which may be in
    another run, is a flag on the chord's row, set when the body's step is written); the
    run's output is a lone task's own result (its run is named after its task, as
    Celery's result of that id is), else the result of its last step: the newest step
    that no other step follows (a chain's last link, a chord's body, a group's last
    member).
    """
    own, leaf, child = steps.alias("own"), steps.alias("leaf"), steps.alias("child")

    def keyed(table: Any) -> tuple[Any, ...]:
        named = () if among is None else (table.c.workflow_run_id == sa.any_(among),)
        return named if on_days is None else (*named, on_days(table.c.run_day))

    is_lone_task = sa.exists().where(
        own.c.workflow_run_id == runs.c.workflow_run_id,
        own.c.workflow_step_id == runs.c.workflow_run_id,
        *keyed(own),
    )
    own_result = (
        sa.select(own.c.result)
        .where(
            own.c.workflow_run_id == runs.c.workflow_run_id,
            own.c.workflow_step_id == runs.c.workflow_run_id,
            *keyed(own),
        )
        .scalar_subquery()
    )
    leaf_result = (
        sa.select(leaf.c.result)
        .where(
            leaf.c.workflow_run_id == runs.c.workflow_run_id,
            *keyed(leaf),
            ~sa.exists().where(
                child.c.workflow_run_id == leaf.c.workflow_run_id,
                child.c.from_step_name == leaf.c.step_name,
                *keyed(child),
            ),
        )
        .order_by(leaf.c.created_at.desc(), leaf.c.workflow_step_id.desc())
        .limit(1)
        .scalar_subquery()
    )
    done = sa.and_(
        ~sa.exists().where(
            steps.c.workflow_run_id == runs.c.workflow_run_id,
            *keyed(steps),
            steps.c.status != inline_text("succeeded"),
        ),
        ~sa.exists().where(
            chords.c.workflow_run_id == runs.c.workflow_run_id,
            *keyed(chords),
            # Text on both databases: ``'true'`` is how each spells the flag as text.
            sa.cast(chords.c.body_written, sa.Text) != inline_text("true"),
        ),
    )
    return done, sa.case((is_lone_task, own_result), else_=leaf_result)


all_steps_succeeded, last_result = completion()
_last_result = last_result

# Guarded in SQL: the run completes only while no step of it is unfinished. The
# caller touches the run row first in the same transaction, so two last steps
# finishing at once serialise on it and the second one sees the first.
complete_run_if_done: Final = (
    sa.update(runs)
    .where(runs.c.workflow_run_id == P("run_id"), _still_going, all_steps_succeeded)
    .values(status="completed", output=_last_result, error=None, updated_at=P("now"))
)

settle_run: Final = (
    sa.update(runs)
    .where(runs.c.workflow_run_id == P("run_id"), _still_going)
    .values(status=P("new_status"), error=P("error"), updated_at=P("now"))
)


# --- the next attempt (resume, rerun) --------------------------------------------


def _retry_step_update(status: str) -> Update:
    return (
        sa.update(steps)
        .where(steps.c.workflow_run_id == run_of_step, steps.c.workflow_step_id == P("step_id"))
        .values(
            status=status,
            result=None,
            error=None,
            current_attempt=sa.func.coalesce(steps.c.current_attempt, 1) + 1,
            updated_at=P("now"),
        )
    )


@cache
def retry_attempt_pg(status: str) -> sa.Select[Any]:
    """One round trip: the step moves to attempt n+1 and that attempt's row is added."""
    step = _retry_step_update(status).returning(*STEP_COLUMNS, steps.c.run_day).cte("step")
    values: dict[str, Any] = {
        "history_id": _typed("history_id", history.c.history_id),
        "run_day": step.c.run_day,
        "workflow_run_id": step.c.workflow_run_id,
        "workflow_step_id": step.c.workflow_step_id,
        "attempt": step.c.current_attempt,
        "status": sa.literal(status, sa.Text),
        "created_at": _typed("now", history.c.created_at),
        "reason": _typed("reason", history.c.reason),
    }
    stamp = TIMESTAMP_COLUMN[status]
    if stamp is not None:
        values[stamp] = _typed("now", history.c.created_at)
    add = sa.insert(history).from_select(
        list(values), sa.select(*values.values()).select_from(step)
    )
    return sa.select(*(step.c[c.name] for c in STEP_COLUMNS)).add_cte(add.cte("attempt"))


@cache
def add_next_attempt(status: str) -> Insert:
    """SQLite: attempt n+1's row, before the step moves to it (:func:`retry_attempt_sqlite`,
    in the same transaction); nothing for a step that does not exist."""
    values: dict[str, Any] = {
        "history_id": P("history_id", type_=history.c.history_id.type),
        "run_day": steps.c.run_day,
        "workflow_run_id": steps.c.workflow_run_id,
        "workflow_step_id": steps.c.workflow_step_id,
        "attempt": sa.func.coalesce(steps.c.current_attempt, 1) + 1,
        "status": sa.literal(status, sa.Text),
        "created_at": P("now", type_=history.c.created_at.type),
        "reason": P("reason", type_=history.c.reason.type),
    }
    stamp = TIMESTAMP_COLUMN[status]
    if stamp is not None:
        values[stamp] = P("now", type_=history.c.created_at.type)
    select = sa.select(*values.values()).where(
        steps.c.workflow_run_id == run_of_step, steps.c.workflow_step_id == P("step_id")
    )
    return sa.insert(history).from_select(list(values), select)


@cache
def retry_attempt_sqlite(status: str) -> Update:
    return _retry_step_update(status).returning(*STEP_COLUMNS)
