"""Statements of the mirror's group commit that the single-event writes do not have.

The transitions and new steps themselves reuse ``sql.attempts``: each is
sent once per batch with many parameter sets (psycopg runs those in pipeline
mode, one round trip), so a batch and a lone event obey the same guards.

Every statement on a run-keyed table names the runs it touches (a distributed
database routes it to their shards), but for the fan-out statements, which look
rows up by another id because nothing in the batch knows their run:

- ``known_steps`` / ``known_steps_pg``: the batch's one read of its steps, by step id.
  An event from a worker's main process (an attempt's end it saw, a lost worker)
  does not know its run; this read tells it, and every later statement names it.
- ``runs_held_by_bodies`` / ``mark_bodies_written``, ``runs_held_by_unsent_bodies``
  and the check in ``open_chord``: by a chord's body id, for chords applied outside
  any run (each header task a run of its own, the body in whichever ran last).
- ``prune_deliveries``: expiry, by age.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.dml import Insert, Update

from pikku_celery.schema import chords
from pikku_celery.schema import mirror_deliveries as deliveries
from pikku_celery.schema import workflow_runs as runs
from pikku_celery.schema import workflow_step as steps
from pikku_celery.schema import workflow_step_history as history
from pikku_celery.store.sql.attempts import (
    Source,
    attempt_upsert,
    attempt_values,
    completion,
    inline_text,
    step_moves,
    step_policy,
    step_values,
    still_going,
)
from pikku_celery.store.sql.spelling import Parameter, Upsert

__all__ = [
    "complete_runs_keyed_pg",
    "complete_runs_pg",
    "count_deliveries",
    "count_deliveries_pg",
    "hand_over_attempt",
    "known_runs",
    "known_runs_pg",
    "known_steps",
    "known_steps_pg",
    "lock_runs_pg",
    "mark_bodies_written",
    "on_days",
    "open_chord",
    "prune_deliveries",
    "record_attempts_pg",
    "runs_held_by_unsent_bodies",
    "schedule_lone_steps_pg",
    "settle_runs_pg",
    "shards_of_keys",
    "steps_present",
    "steps_present_pg",
    "uncount_deliveries",
]

P = sa.bindparam

#: The steps a batch names, with what resolving an event needs: its current
#: attempt and its run (and whether that run is a durable workflow's), and the run's day,
#: which every row the batch writes of that run carries.
known_steps: Final = (
    sa.select(
        steps.c.workflow_step_id,
        steps.c.current_attempt,
        steps.c.workflow_run_id,
        runs.c.wire,
        runs.c.run_day,
    )
    .join(runs, runs.c.workflow_run_id == steps.c.workflow_run_id)
    .where(steps.c.workflow_step_id.in_(P("step_ids", expanding=True)))
)

#: Which of a batch's new steps are there after their inserts: a step whose name
#: another writer took at the same moment was not written, and waits for the next batch.
steps_present: Final = sa.select(steps.c.workflow_step_id).where(
    steps.c.workflow_run_id.in_(P("run_ids", expanding=True)),
    steps.c.workflow_step_id.in_(P("step_ids", expanding=True)),
)

known_runs: Final = sa.select(runs.c.workflow_run_id, runs.c.run_day).where(
    runs.c.workflow_run_id.in_(P("run_ids", expanding=True))
)


def count_deliveries(insert: Upsert) -> Insert:
    """Record delivery events by id; RETURNING gives the ones not counted before."""
    statement: Insert = insert(deliveries).on_conflict_do_nothing().returning(deliveries.c.event_id)
    return statement


prune_deliveries: Final = sa.delete(deliveries).where(deliveries.c.created_at < P("before"))

#: Deliveries a batch counted of steps it could not write, taken back in its transaction.
uncount_deliveries: Final = sa.delete(deliveries).where(
    deliveries.c.workflow_run_id.in_(P("run_ids", expanding=True)),
    deliveries.c.event_id.in_(P("event_ids", expanding=True)),
)

#: The chords whose bodies are among these new steps are no longer waiting; returns the
#: runs they hold open (fan-out, by body id: such a run may be another header task's, as
#: a chord applied outside any run makes a run per header task, and its body goes into the
#: run of whichever ran last), which nothing else looks at again.
mark_bodies_written: Final = (
    sa.update(chords)
    .where(chords.c.body_id.in_(P("body_ids", expanding=True)))
    .values(body_written=True)
    .returning(chords.c.workflow_run_id, chords.c.run_day)
)

#: The runs held open by these chords whose bodies are not written: a header task of
#: each failed for good, so Celery will never send the body they wait for.
runs_held_by_unsent_bodies: Final = sa.select(
    chords.c.body_id, chords.c.workflow_run_id, chords.c.run_day
).where(
    chords.c.body_id.in_(P("body_ids", expanding=True)),
    sa.cast(chords.c.body_written, sa.Text) != inline_text("true"),
)

_held = chords.alias("held")
_body = steps.alias("body")


def open_chord(insert: Upsert, typed: Parameter) -> Insert:
    """A chord of the run waits for its body; the header's other tasks name it again.

    One run holds a chord: a header task of another run (a chord applied outside any
    run) finds it held and holds nothing. Its body may be written already (a late
    publish): then the row says so, and holds nothing either.
    """
    body_id = typed("body_id", sa.Text())
    written = sa.exists().where(_body.c.workflow_step_id == body_id)
    select = sa.select(
        body_id,
        typed("run_id", sa.Text()),
        typed("now", chords.c.created_at.type),
        typed("run_day", chords.c.run_day.type),
        sa.case(
            (written, sa.literal(True, chords.c.body_written.type)),
            else_=sa.literal(False, chords.c.body_written.type),
        ),
    ).where(~sa.exists().where(_held.c.body_id == body_id))
    statement: Insert = (
        insert(chords)
        .from_select(
            ["body_id", "workflow_run_id", "created_at", "run_day", "body_written"], select
        )
        .on_conflict_do_nothing()
    )
    return statement


# --- PostgreSQL: a whole batch in one statement per kind ------------------------------
#
# The batch's rows travel as one JSON array, unpacked by jsonb_to_recordset into a
# typed set that the statement joins against: one statement, one plan, whatever
# the batch holds. JSON values travel as text and are cast where they land.

_TS = sa.DateTime(timezone=True)
_DAY = sa.Date()
_TEXTS = postgresql.ARRAY(sa.Text())


def on_days(column: Any) -> sa.ColumnElement[bool]:
    """The row's day is within the batch's (``first_day`` to ``last_day``): on the
    partitioned layout the executor then reads those days' partitions alone, as a
    distributed database reads the runs' shards. A range, not a list: PostgreSQL prunes
    partitions by a parameter compared with the key, not by one array of them. A row with
    no day (written before revision 0016, on the plain layout only) is never left out."""
    return sa.or_(
        column.between(P("first_day", type_=_DAY), P("last_day", type_=_DAY)), column.is_(None)
    )


_TRANSITION_ROWS: Final = (
    ("run_id", sa.Text()),
    ("step_id", sa.Text()),
    ("attempt_no", sa.Integer()),
    ("history_id", sa.Text()),
    ("now", _TS),
    ("scheduled_at", _TS),
    ("running_at", _TS),
    ("ended_at", _TS),
    ("result", sa.Text()),
    ("error", sa.Text()),
    ("task_id", sa.Text()),
    ("worker", sa.Text()),
    ("pid", sa.Integer()),
    ("eta", _TS),
    ("reason", sa.Text()),
    ("deliveries", sa.Integer()),
    ("retries", sa.Integer()),
    ("retry_delay", sa.Text()),
    ("run_day", _DAY),
)
_RUN_ROWS: Final = (
    ("run_id", sa.Text()),
    ("now", _TS),
    ("status", sa.Text()),
    ("error", sa.Text()),
)


def _rows(name: str, columns: tuple[tuple[str, Any], ...]) -> Any:
    unpacked = sa.func.jsonb_to_recordset(sa.cast(P("rows"), postgresql.JSONB)).table_valued(
        *(sa.column(column, type_) for column, type_ in columns)
    )
    derived = unpacked.render_derived(name=f"{name}_rows", with_types=True)
    return sa.select(*derived.c).cte(name)


def _reader(rows: Any) -> Source:
    def read(name: str) -> Any:
        column = rows.c[name]
        return sa.cast(column, postgresql.JSONB) if name in ("result", "error") else column

    return read


def _distinct_on(select: sa.Select[Any], column: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """PostgreSQL's ``DISTINCT ON (column)``, in the spelling of the SQLAlchemy installed.

    SQLAlchemy 2.1 spells it ``.ext(distinct_on(...))`` and deprecates the only spelling
    2.0 has, ``.distinct(column)``; pyproject.toml allows both.
    """
    if hasattr(select, "ext"):
        return select.ext(postgresql.distinct_on(column))
    return select.distinct(column)


@cache
def record_attempts_pg(status: str) -> Insert:
    """Every transition of the batch that ends at ``status``: attempt rows and step rows.

    Each (step, attempt) comes once; a step's row follows the newest attempt
    of the set, as applying them one by one would leave it.
    """
    events = _rows("ev", _TRANSITION_ROWS)
    newest = (
        _distinct_on(
            sa.select(
                *(
                    events.c[name]
                    for name in (
                        "run_id",
                        "step_id",
                        "attempt_no",
                        "now",
                        "result",
                        "error",
                        "retries",
                    )
                ),
                events.c.retry_delay,
            ),
            events.c.step_id,
        )
        .order_by(events.c.step_id, events.c.attempt_no.desc())
        .cte("newest")
    )
    step_rows = _reader(newest)
    step_update = (
        sa.update(steps)
        .where(
            # The keys again as arrays: the planner finds the rows by index instead
            # of scanning the table to join them with the set (and a distributed
            # database, the shards of the runs named).
            steps.c.workflow_run_id == sa.any_(P("run_ids", type_=_TEXTS)),
            steps.c.workflow_step_id == sa.any_(P("step_ids", type_=_TEXTS)),
            on_days(steps.c.run_day),
            steps.c.workflow_run_id == newest.c.run_id,
            steps.c.workflow_step_id == newest.c.step_id,
            sa.or_(step_moves(status, step_rows), step_policy(status, step_rows)),
        )
        .values(**step_values(status, step_rows))
    )
    values = attempt_values(status, _reader(events)) | {"run_day": events.c.run_day}
    insert = postgresql.insert(history).from_select(
        list(values), sa.select(*values.values()).select_from(events)
    )
    statement = attempt_upsert(insert, status)
    return statement.add_cte(step_update.cte("step"))


_LONE_ROWS: Final = (
    ("step_id", sa.Text()),
    ("base_name", sa.Text()),
    ("rpc_name", sa.Text()),
    ("data", sa.Text()),
    ("retries", sa.Integer()),
    ("retry_delay", sa.Text()),
    ("routing", sa.Text()),
    ("now", _TS),
    ("history_id", sa.Text()),
    ("eta", _TS),
    ("run_workflow", sa.Text()),
    ("run_input", sa.Text()),
    ("run_wire", sa.Text()),
    ("run_day", _DAY),
)


def _schedule_lone_steps() -> sa.CompoundSelect[Any]:
    """Lone tasks (each its own run, under its own task id): every run, step and first
    attempt of the batch in one statement, whatever the number of tasks.

    A lone task's run holds no other step, so its step takes its name as it is; one
    that exists already (a publish written twice, or adopted by its worker first) is
    left as it is, with its attempt. Each step id comes once (the caller sees to it).
    Returns the ids of the steps that are there now, as far as it can tell.
    """
    lone = _rows("lone", _LONE_ROWS)
    text = sa.Text()

    def jsonb(column: Any) -> Any:
        return sa.cast(column, postgresql.JSONB)

    run = postgresql.insert(runs).from_select(
        [
            "workflow_run_id",
            "workflow",
            "status",
            "input",
            "state",
            "wire",
            "created_at",
            "updated_at",
            "run_day",
        ],
        sa.select(
            lone.c.step_id,
            lone.c.run_workflow,
            sa.literal("running", text),
            jsonb(lone.c.run_input),
            jsonb(sa.literal("{}", text)),
            jsonb(lone.c.run_wire),
            lone.c.now,
            lone.c.now,
            lone.c.run_day,
        ),
    )
    step = (
        postgresql.insert(steps)
        .from_select(
            [
                "workflow_step_id",
                "workflow_run_id",
                "step_name",
                "rpc_name",
                "data",
                "status",
                "retries",
                "retry_delay",
                "current_attempt",
                "routing",
                "created_at",
                "updated_at",
                "run_day",
            ],
            sa.select(
                lone.c.step_id,
                lone.c.step_id,
                lone.c.base_name,
                lone.c.rpc_name,
                jsonb(lone.c.data),
                sa.literal("scheduled", text),
                lone.c.retries,
                lone.c.retry_delay,
                sa.literal(1, sa.Integer()),
                jsonb(lone.c.routing),
                lone.c.now,
                lone.c.now,
                lone.c.run_day,
            ),
        )
        .on_conflict_do_nothing()
        .returning(steps.c.workflow_step_id)
        .cte("step")
    )
    attempt = sa.insert(history).from_select(
        [
            "history_id",
            "workflow_run_id",
            "workflow_step_id",
            "attempt",
            "status",
            "created_at",
            "scheduled_at",
            "eta",
            "task_id",
            "reason",
            "run_day",
        ],
        sa.select(
            lone.c.history_id,
            step.c.workflow_step_id,  # a lone task's run is named after its step
            step.c.workflow_step_id,
            sa.literal(1, sa.Integer()),
            sa.literal("scheduled", text),
            lone.c.now,
            lone.c.now,
            lone.c.eta,
            step.c.workflow_step_id,
            sa.literal("first", text),
            lone.c.run_day,
        ).select_from(step.join(lone, lone.c.step_id == step.c.workflow_step_id)),
    )
    # The steps written, and those there before it: its snapshot is the statement's, so a
    # step another batch wrote meanwhile is in neither, and the caller looks it up.
    existing = (
        sa.select(steps.c.workflow_step_id)
        .join(
            lone,
            sa.and_(
                steps.c.workflow_run_id == lone.c.step_id,
                steps.c.workflow_step_id == lone.c.step_id,
            ),
        )
        # The runs again as an array (a lone task's run is its step's id): a planner
        # reads only where they are.
        .where(
            steps.c.workflow_run_id == sa.any_(P("run_ids", type_=_TEXTS)),
            on_days(steps.c.run_day),
        )
    )
    query = sa.union_all(sa.select(step.c.workflow_step_id), existing)
    query = query.add_cte(run.on_conflict_do_nothing().cte("run"))
    return query.add_cte(attempt.cte("attempt"))


schedule_lone_steps_pg: Final = _schedule_lone_steps()


#: Locks the batch's runs in one order, so two batches never deadlock on them; the
#: completion check that follows is a new statement, so it sees whatever another
#: batch committed before this one got the lock. A lock, not a write: no new row
#: version for a run that does not complete.
lock_runs_pg: Final = (
    sa.select(runs.c.workflow_run_id)
    .where(runs.c.workflow_run_id == sa.any_(P("run_ids", type_=_TEXTS)), on_days(runs.c.run_day))
    .order_by(runs.c.workflow_run_id)
    .with_for_update(key_share=True)
)


# The runs' steps and chords are read by the run row's id alone: naming the runs' array
# in each subquery too lets a planner prune them, but costs a probe per run named in every
# one (a batch of lone tasks ends a hundred runs), a third of a batch's time.
def _complete_runs(among: Any = None) -> Update:
    """The batch's runs whose steps all succeeded, completed with their output. ``among``:
    the runs named in every subquery too (``completion``)."""
    done, output = completion(among, on_days)
    completing = _rows("completing", _RUN_ROWS)
    return (
        sa.update(runs)
        .where(
            runs.c.workflow_run_id == sa.any_(P("run_ids", type_=_TEXTS)),
            on_days(runs.c.run_day),
            runs.c.workflow_run_id == completing.c.run_id,
            still_going,
            done,
        )
        .values(status="completed", output=output, error=None, updated_at=completing.c.now)
    )


complete_runs_pg: Final = _complete_runs()

# Where batches are cut by shard (``store/batch_pieces.py``): the runs named in every
# subquery too, so a distributed database runs the update on their one shard, not all.
complete_runs_keyed_pg: Final = _complete_runs(P("run_ids", type_=_TEXTS))

settle_runs_pg: Final = (
    sa.update(runs)
    .where(
        runs.c.workflow_run_id == sa.any_(P("run_ids", type_=_TEXTS)),
        on_days(runs.c.run_day),
        runs.c.workflow_run_id == (settling := _rows("settling", _RUN_ROWS)).c.run_id,
        still_going,
    )
    .values(
        status=settling.c.status,
        error=sa.cast(settling.c.error, postgresql.JSONB),
        updated_at=settling.c.now,
    )
)


# The lookups again, on PostgreSQL: one array parameter instead of an IN list,
# so the SQL text is the same for every batch and psycopg prepares it once.
_any_step = sa.any_(P("step_ids", type_=_TEXTS))

known_steps_pg: Final = (
    sa.select(
        steps.c.workflow_step_id,
        steps.c.current_attempt,
        steps.c.workflow_run_id,
        runs.c.wire,
        runs.c.run_day,
    )
    .join(runs, runs.c.workflow_run_id == steps.c.workflow_run_id)
    .where(steps.c.workflow_step_id == _any_step)
)

steps_present_pg: Final = sa.select(steps.c.workflow_step_id).where(
    steps.c.workflow_run_id == sa.any_(P("run_ids", type_=_TEXTS)),
    steps.c.workflow_step_id == _any_step,
    on_days(steps.c.run_day),
)

known_runs_pg: Final = sa.select(runs.c.workflow_run_id, runs.c.run_day).where(
    runs.c.workflow_run_id == sa.any_(P("run_ids", type_=_TEXTS))
)

count_deliveries_pg: Final = (
    postgresql.insert(deliveries)
    .from_select(
        ["workflow_run_id", "event_id", "created_at", "run_day"],
        sa.select(
            *(
                counted := _rows(
                    "counted",
                    (
                        ("workflow_run_id", sa.Text()),
                        ("event_id", sa.Text()),
                        ("created_at", _TS),
                        ("run_day", _DAY),
                    ),
                )
            ).c
        ),
    )
    .on_conflict_do_nothing()
    .returning(deliveries.c.event_id)
)


#: A replaced attempt names the task that carries its task id on; set once, so a
#: replacement that is replaced again keeps the first name the step handed over to.
hand_over_attempt: Final = (
    sa.update(history)
    .where(
        history.c.workflow_run_id == P("run_id"),
        history.c.workflow_step_id == P("step_id"),
        history.c.attempt == P("attempt_no"),
        history.c.replaced_by.is_(None),
    )
    .values(replaced_by=P("replaced_by"))
)


#: Where the tables are distributed (Citus): the shard of each key. Every distributed table
#: is in one co-location group, hashed alike, so a key's shard of the runs' table names its
#: group in every table.
shards_of_keys: Final = sa.text(
    "SELECT k, get_shard_id_for_distribution_column('workflow_runs', k) "
    "FROM unnest(CAST(:keys AS text[])) AS k"
)
