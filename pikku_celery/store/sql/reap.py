"""Statements for the stuck-attempt reaper and the stale-message report.

Every write here is guarded on what the reaper saw (the attempt number, its
status, its delivery count), so reapers on several machines at once agree:
one of them moves an attempt, the others change nothing.
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa

from pikku_celery.schema import workflow_runs as runs
from pikku_celery.schema import workflow_step as steps
from pikku_celery.schema import workflow_step_history as history
from pikku_celery.store.models import WAIT_RPC
from pikku_celery.store.sql.attempts import run_of_step

__all__ = [
    "give_up_attempt",
    "give_up_step",
    "lose_attempt",
    "lose_step",
    "not_a_wait",
    "open_attempts",
    "retake_lost",
    "retake_unsent",
    "stale_scheduled",
    "unsent_claims",
    "unsettled_runs",
]

P = sa.bindparam

_current = sa.and_(
    history.c.workflow_run_id == steps.c.workflow_run_id,
    history.c.workflow_step_id == steps.c.workflow_step_id,
    history.c.attempt == sa.func.coalesce(steps.c.current_attempt, 1),
)

# A wait for an event is scheduled until the event comes, however long: it has no
# message to be late or unsent.
not_a_wait: Final = sa.func.coalesce(steps.c.rpc_name, "") != WAIT_RPC

# What the reaper needs of a step to send it again: its run, its task and its call.
_step_to_send: Final = (
    steps.c.workflow_run_id,
    runs.c.wire,
    steps.c.workflow_step_id,
    steps.c.step_name,
    steps.c.rpc_name,
    steps.c.data,
    history.c.attempt,
    steps.c.routing,
)

# The status filter matches the partial index's condition, so the scan stays
# inside the unfinished steps.
open_attempts: Final = (
    sa.select(
        *_step_to_send,
        steps.c.retries,
        history.c.status,
        history.c.task_id,
        history.c.worker,
        history.c.pid,
        history.c.delivery_count,
        history.c.running_at,
        history.c.error,
        steps.c.updated_at,
    )
    .select_from(steps.join(history, _current).join(runs))
    .where(
        steps.c.status.in_(("running", "lost")),
        history.c.status.in_(("running", "lost")),
        steps.c.updated_at < P("before"),
        # A child workflow's step runs as long as its child run: no worker holds it.
        steps.c.child_run_id.is_(None),
        # A replaced attempt is Celery's: its replacement carries the task id on, and
        # publishing the step again would run the replaced body a second time.
        history.c.replaced_by.is_(None),
    )
    .order_by(steps.c.updated_at)
    .limit(P("limit"))
)

stale_scheduled: Final = (
    sa.select(
        steps.c.workflow_run_id,
        steps.c.workflow_step_id,
        steps.c.step_name,
        steps.c.rpc_name,
        history.c.attempt,
        history.c.scheduled_at,
        history.c.eta,
    )
    .select_from(steps.join(history, _current))
    .where(
        steps.c.status == "scheduled",
        steps.c.updated_at < P("before"),
        not_a_wait,
        # A message held back on purpose (countdown, ETA) is not late until then.
        sa.or_(history.c.eta.is_(None), history.c.eta < P("before")),
    )
    .order_by(steps.c.updated_at)
    .limit(P("limit"))
)

# running -> lost, only for the delivery the reaper looked at: a redelivery
# that started meanwhile has a higher count and is left alone.
lose_attempt: Final = (
    sa.update(history)
    .where(
        history.c.workflow_run_id == run_of_step,
        history.c.workflow_step_id == P("step_id"),
        history.c.attempt == P("attempt_no"),
        history.c.status == "running",
        history.c.delivery_count == P("seen_deliveries"),
    )
    # No outcome time: a lost attempt may still be redelivered and finish.
    .values(status="lost", error=P("error"))
)

lose_step: Final = (
    sa.update(steps)
    .where(
        steps.c.workflow_run_id == run_of_step,
        steps.c.workflow_step_id == P("step_id"),
        sa.func.coalesce(steps.c.current_attempt, 1) == P("attempt_no"),
        steps.c.status == "running",
    )
    .values(status="lost", error=P("error"), updated_at=P("now"))
)

# The lost attempt is over once it is given up: it keeps saying it was lost, and gets its
# end time, which is what tells a reader (Pikku's getRunStatus) that the attempt after it is
# the current one.
give_up_attempt: Final = (
    sa.update(history)
    .where(
        history.c.workflow_run_id == run_of_step,
        history.c.workflow_step_id == P("step_id"),
        history.c.attempt == P("attempt_no"),
        history.c.status == "lost",
        history.c.failed_at.is_(None),
    )
    .values(failed_at=P("now"), error=P("error"))
)

# lost -> failed for good; the attempt row keeps saying it was lost.
give_up_step: Final = (
    sa.update(steps)
    .where(
        steps.c.workflow_run_id == run_of_step,
        steps.c.workflow_step_id == P("step_id"),
        sa.func.coalesce(steps.c.current_attempt, 1) == P("attempt_no"),
        steps.c.status == "lost",
    )
    .values(status="failed", error=P("error"), result=None, updated_at=P("now"))
)

# A step a replay claimed whose message never went out: the dispatch mark (the
# attempt's task id, set once the message is out) is missing long after the claim.
# Only claims leave it empty; every other scheduled attempt is written with it.
unsent_claims: Final = (
    sa.select(*_step_to_send, history.c.scheduled_at)
    .select_from(steps.join(history, _current).join(runs))
    .where(
        steps.c.status == "scheduled",
        history.c.status == "scheduled",
        history.c.task_id.is_(None),
        steps.c.rpc_name.is_not(None),
        not_a_wait,
        history.c.scheduled_at < P("before"),
    )
    .order_by(history.c.scheduled_at)
    .limit(P("limit"))
)

# Whoever moves the claim's time on sends its message; a second reaper's guard fails.
retake_unsent: Final = (
    sa.update(history)
    .where(
        history.c.workflow_run_id == run_of_step,
        history.c.workflow_step_id == P("step_id"),
        history.c.attempt == P("attempt_no"),
        history.c.status == "scheduled",
        history.c.task_id.is_(None),
        history.c.scheduled_at <= P("seen"),
    )
    .values(scheduled_at=P("now"))
)

# A lost workflow step to send (again): whoever moves its time on from what it read
# sends it; a second reaper that read the same row finds it moved.
retake_lost: Final = (
    sa.update(steps)
    .where(
        steps.c.workflow_run_id == run_of_step,
        steps.c.workflow_step_id == P("step_id"),
        sa.func.coalesce(steps.c.current_attempt, 1) == P("attempt_no"),
        steps.c.status == "lost",
        steps.c.updated_at <= P("seen"),
    )
    .values(updated_at=P("now"))
)

# Keyset pages by id: runs that settle while recovery pages through cannot make
# it skip others, as an offset would.
unsettled_runs: Final = (
    sa.select(runs.c.workflow_run_id)
    .where(
        runs.c.workflow.in_(P("workflows", expanding=True)),
        runs.c.status.in_(("running", "suspended")),
        runs.c.workflow_run_id > P("after"),
    )
    .order_by(runs.c.workflow_run_id)
    .limit(P("limit"))
)
