"""The statements of ``store/runs.py``: runs, their state, and reads of their steps.

Parameters are always bound (``:name``); nothing user-supplied is ever put
into SQL text. Statements for state changes are guarded conditional UPDATEs:
an attempt's status only moves forward, so late and duplicate events are
no-ops rather than rewinds.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from pikku_celery.schema import (
    workflow_runs as runs,
)
from pikku_celery.schema import (
    workflow_step as steps,
)
from pikku_celery.schema import (
    workflow_step_history as history,
)

__all__ = [
    "STEP_COLUMNS",
    "delete_run",
    "get_run",
    "get_run_state",
    "get_step_state",
    "insert_run",
    "list_runs",
    "list_step_states",
    "run_day_of",
    "run_history",
    "update_run_state_pg",
    "update_run_state_sqlite",
    "update_run_status",
]

P = sa.bindparam

# An attempt's step: through its run too, the key the two tables share.
_same_step = sa.and_(
    history.c.workflow_run_id == steps.c.workflow_run_id,
    history.c.workflow_step_id == steps.c.workflow_step_id,
)


# --- runs -------------------------------------------------------------------

insert_run: Final = sa.insert(runs)

# What a run is to its readers: Pikku's columns (its day only places its rows).
_RUN_COLUMNS: Final = tuple(c for c in runs.c if c.name != "run_day")

get_run: Final = sa.select(*_RUN_COLUMNS).where(runs.c.workflow_run_id == P("run_id"))

#: The day a run is filed under, which every row written of it carries.
run_day_of: Final = sa.select(runs.c.run_day).where(runs.c.workflow_run_id == P("run_id"))

get_run_state: Final = sa.select(runs.c.state).where(runs.c.workflow_run_id == P("run_id"))

update_run_status: Final = (
    sa.update(runs)
    .where(runs.c.workflow_run_id == P("run_id"))
    .values(status=P("status"), output=P("output"), error=P("error"), updated_at=P("now"))
)

delete_run: Final = sa.delete(runs).where(runs.c.workflow_run_id == P("run_id"))


@cache
def list_runs(by_workflow: bool, by_status: bool) -> sa.Select[Any]:
    query = sa.select(*_RUN_COLUMNS)
    if by_workflow:
        query = query.where(runs.c.workflow == P("workflow"))
    if by_status:
        query = query.where(runs.c.status.in_(P("statuses", expanding=True)))
    return (
        query.order_by(runs.c.created_at.desc(), runs.c.workflow_run_id.desc())
        .limit(P("limit"))
        .offset(P("offset"))
    )


update_run_state_pg: Final = (
    sa.update(runs)
    .where(runs.c.workflow_run_id == P("run_id"))
    .values(
        # jsonb || object replaces exactly one key, whatever characters it holds.
        state=sa.func.coalesce(sa.cast(runs.c.state, postgresql.JSONB), sa.text("'{}'::jsonb")).op(
            "||"
        )(
            sa.func.jsonb_build_object(
                sa.cast(P("key", type_=sa.Text), sa.Text),
                sa.cast(P("value", type_=sa.Text), postgresql.JSONB),
            )
        ),
        updated_at=P("now"),
    )
)


def _sqlite_state_with_key() -> sa.ColumnElement[Any]:
    # SQLite's JSON paths cannot name every key ('$."a\"b"' silently does
    # nothing), so no path is used: a merge patch with null drops the key
    # exactly, then the new member is put in front of what is left.
    without_key = sa.func.json_patch(
        sa.func.coalesce(runs.c.state, "{}"),
        sa.func.json_object(P("key", type_=sa.Text), sa.null()),
    )
    member = (
        sa.literal("{", sa.Text)
        + sa.func.json_quote(P("key", type_=sa.Text))
        + ":"
        + sa.func.json(P("value", type_=sa.Text))
    )
    rest = sa.case(
        (without_key == "{}", sa.literal("}", sa.Text)),
        else_=sa.literal(",", sa.Text) + sa.func.substr(without_key, 2),
    )
    return member + rest


update_run_state_sqlite: Final = (
    sa.update(runs)
    .where(runs.c.workflow_run_id == P("run_id"))
    .values(state=_sqlite_state_with_key(), updated_at=P("now"))
)


# --- steps ------------------------------------------------------------------


STEP_COLUMNS: Final = tuple(c for c in steps.c if c.name != "run_day")

get_step_state: Final = sa.select(*STEP_COLUMNS).where(
    steps.c.workflow_run_id == P("run_id"), steps.c.step_name == P("step_name")
)

list_step_states: Final = (
    sa.select(*STEP_COLUMNS)
    .where(steps.c.workflow_run_id == P("run_id"))
    .order_by(steps.c.created_at, steps.c.workflow_step_id)
)


run_history: Final = (
    sa.select(
        history.c.history_id,
        history.c.workflow_step_id,
        steps.c.step_name,
        steps.c.from_step_name,
        steps.c.retries,
        steps.c.retry_delay,
        history.c.attempt,
        history.c.status,
        history.c.result,
        history.c.error,
        history.c.created_at,
        history.c.scheduled_at,
        history.c.running_at,
        history.c.succeeded_at,
        history.c.failed_at,
        history.c.task_id,
        history.c.worker,
        history.c.pid,
        history.c.delivery_count,
        history.c.eta,
        history.c.reason,
        history.c.replaced_by,
    )
    .select_from(steps.join(history, _same_step))
    .where(steps.c.workflow_run_id == P("run_id"))
    # Steps in the order they were created, each step's attempts in number order.
    .order_by(steps.c.created_at, steps.c.workflow_step_id, history.c.attempt)
)
