"""Statements for what durable workflows add to steps: events, child runs, branches, start ids."""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from sqlalchemy.sql.dml import Insert

from pikku_celery.schema import run_events as events
from pikku_celery.schema import workflow_runs as runs
from pikku_celery.schema import workflow_step as steps
from pikku_celery.store.sql.attempts import run_of_step
from pikku_celery.store.sql.spelling import Upsert

__all__ = [
    "hold_open_step",
    "insert_event",
    "insert_run_if_absent",
    "list_events",
    "next_untaken_event",
    "run_status",
    "set_branch_taken",
    "set_child_run",
    "set_step_data",
    "take_event",
]

P = sa.bindparam


def insert_run_if_absent(insert: Upsert) -> Insert:
    """A run under a caller's id, unless one has it: of racing starts, one inserts."""
    statement: Insert = insert(runs).on_conflict_do_nothing().returning(runs.c.workflow_run_id)
    return statement


run_status: Final = sa.select(runs.c.status, runs.c.workflow, runs.c.run_day).where(
    runs.c.workflow_run_id == P("run_id")
)

insert_event: Final = sa.insert(events)

# The oldest event of that name nobody took: events are taken in the order sent.
next_untaken_event: Final = (
    sa.select(events.c.event_id, events.c.data)
    .where(
        events.c.workflow_run_id == P("run_id"),
        events.c.name == P("name"),
        events.c.taken_by_step_id.is_(None),
    )
    .order_by(events.c.sent_at, events.c.event_id)
    .limit(1)
)

# A second wait that read the same event finds it taken (0 rows) and reads the next.
take_event: Final = (
    sa.update(events)
    .where(
        events.c.workflow_run_id == P("run_id"),
        events.c.event_id == P("the_event"),
        events.c.taken_by_step_id.is_(None),
    )
    .values(taken_by_step_id=P("step_id"), taken_at=P("now"))
)

list_events: Final = (
    sa.select(*events.c)
    .where(events.c.workflow_run_id == P("run_id"))
    .order_by(events.c.sent_at, events.c.event_id)
)

# Taken first by whatever ends a wait (an event, its timeout): the row lock makes
# two replays of one run take turns, and the second finds the wait ended (0 rows).
hold_open_step: Final = (
    sa.update(steps)
    .where(
        steps.c.workflow_run_id == run_of_step,
        steps.c.workflow_step_id == P("step_id"),
        steps.c.status == "scheduled",
        sa.func.coalesce(steps.c.current_attempt, 1) == P("attempt_no"),
    )
    .values(updated_at=P("now"))
)

set_step_data: Final = (
    sa.update(steps)
    .where(steps.c.workflow_run_id == run_of_step, steps.c.workflow_step_id == P("step_id"))
    .values(data=P("data"))
)

set_child_run: Final = (
    sa.update(steps)
    .where(steps.c.workflow_run_id == run_of_step, steps.c.workflow_step_id == P("step_id"))
    .values(child_run_id=P("child_run_id"))
)

set_branch_taken: Final = (
    sa.update(steps)
    .where(steps.c.workflow_run_id == run_of_step, steps.c.workflow_step_id == P("step_id"))
    .values(branch_taken=P("branch"), updated_at=P("now"))
)
