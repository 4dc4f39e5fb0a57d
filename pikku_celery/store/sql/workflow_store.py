"""The statements of ``WorkflowStore``'s own operations (runs, steps, versions).

Parameters are always bound (``:name``); nothing user-supplied is ever put
into SQL text. Statements for state changes are guarded conditional UPDATEs:
an attempt's status only moves forward, so late and duplicate events are
no-ops rather than rewinds.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert, Update

from pikku_celery.schema import (
    workflow_runs as runs,
)
from pikku_celery.schema import (
    workflow_step as steps,
)
from pikku_celery.schema import (
    workflow_step_history as history,
)
from pikku_celery.schema import (
    workflow_versions as versions,
)
from pikku_celery.store.models import STATUS_RANK

__all__ = [
    "TIMESTAMP_COLUMN",
    "delete_run",
    "get_run",
    "get_run_state",
    "get_step_state",
    "get_workflow_version",
    "insert_attempt",
    "insert_run",
    "insert_step",
    "list_runs",
    "list_step_states",
    "ranked_below",
    "retry_attempt_pg",
    "retry_attempt_sqlite",
    "run_history",
    "step_exists",
    "transition_pg",
    "transition_sqlite_attempt",
    "transition_sqlite_repair",
    "transition_sqlite_step",
    "update_run_state_pg",
    "update_run_state_sqlite",
    "update_run_status",
    "update_workflow_version_status",
    "upsert_workflow_version",
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
    it rules out: short SQL (a batch statement holds it many times), nothing to evaluate."""
    at_or_above = [name for name, order in STATUS_RANK.items() if order >= STATUS_RANK[status]]
    return sa.and_(*(column != name for name in at_or_above))


def _outcome_values(status: str) -> dict[str, Any]:
    """Result and error columns: a success clears the error, a failure the result."""
    if status == "succeeded":
        return {"result": P("result"), "error": None}
    if status in ("failed", "cancelled"):
        return {"result": None, "error": P("error")}
    return {}


def _attempt_values(status: str) -> dict[str, Any]:
    values: dict[str, Any] = {"status": status, **_outcome_values(status)}
    stamp = TIMESTAMP_COLUMN[status]
    if stamp is not None:
        values[stamp] = P("now")
    return values


def _step_update(status: str) -> Update:
    """The step row of the current attempt moves to ``status`` if that is forward."""
    return (
        sa.update(steps)
        .where(
            steps.c.workflow_step_id == P("step_id"),
            ranked_below(steps.c.status, status),
        )
        .values(
            status=status,
            updated_at=P("now"),
            # A row from an older writer has no attempt number: repair it to 1.
            current_attempt=sa.func.coalesce(steps.c.current_attempt, 1),
            **_outcome_values(status),
        )
    )


# --- runs -------------------------------------------------------------------

insert_run: Final = sa.insert(runs)

_RUN_COLUMNS: Final = tuple(runs.c)

get_run: Final = sa.select(*_RUN_COLUMNS).where(runs.c.workflow_run_id == P("run_id"))

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

insert_step: Final = sa.insert(steps)
insert_attempt: Final = sa.insert(history)

_STEP_COLUMNS: Final = tuple(steps.c)

get_step_state: Final = sa.select(*_STEP_COLUMNS).where(
    steps.c.workflow_run_id == P("run_id"), steps.c.step_name == P("step_name")
)

list_step_states: Final = (
    sa.select(*_STEP_COLUMNS)
    .where(steps.c.workflow_run_id == P("run_id"))
    .order_by(steps.c.created_at, steps.c.workflow_step_id)
)

step_exists: Final = sa.select(steps.c.workflow_step_id).where(
    steps.c.workflow_step_id == P("step_id")
)


@cache
def transition_pg(status: str) -> sa.Select[Any]:
    """One round trip: the step row and its current attempt's row, together.

    The attempt row is upserted, so a step whose attempt row is missing (an
    older writer's row) gets it back instead of losing the outcome.
    """
    step = (
        _step_update(status)
        .returning(steps.c.workflow_step_id, steps.c.current_attempt)
        .cte("step")
    )
    values = _attempt_values(status)
    row: dict[str, Any] = {
        "history_id": _typed("history_id", history.c.history_id),
        "workflow_step_id": step.c.workflow_step_id,
        "attempt": step.c.current_attempt,
        "created_at": _typed("now", history.c.created_at),
    }
    for name, value in values.items():
        if isinstance(value, sa.BindParameter):
            row[name] = _typed(value.key, history.c[name])
        else:
            row[name] = (
                sa.literal(value, history.c[name].type) if value is not None else (sa.null())
            )
    upsert = postgresql.insert(history).from_select(
        list(row), sa.select(*row.values()).select_from(step)
    )
    upsert = upsert.on_conflict_do_update(
        index_elements=[history.c.workflow_step_id, history.c.attempt],
        set_={name: upsert.excluded[name] for name in values},
        where=ranked_below(history.c.status, status),
    )
    return sa.select(step.c.current_attempt).add_cte(upsert.cte("attempt"))


def _typed(name: str, column: sa.Column[Any]) -> sa.ColumnElement[Any]:
    # In INSERT ... SELECT, PostgreSQL needs each parameter's type spelled out.
    return sa.cast(P(name), column.type)


@cache
def transition_sqlite_step(status: str) -> Update:
    return _step_update(status).returning(steps.c.current_attempt)


@cache
def transition_sqlite_attempt(status: str) -> Update:
    return (
        sa.update(history)
        .where(
            history.c.workflow_step_id == P("step_id"),
            history.c.attempt == P("attempt_no"),
            ranked_below(history.c.status, status),
        )
        .values(**_attempt_values(status))
    )


@cache
def transition_sqlite_repair(status: str) -> Insert:
    """The attempt row an older writer never made, written with this outcome."""
    return (
        sqlite.insert(history)
        .values(
            history_id=P("history_id"),
            workflow_step_id=P("step_id"),
            attempt=P("attempt_no"),
            created_at=P("now"),
            **_attempt_values(status),
        )
        .on_conflict_do_nothing(index_elements=["workflow_step_id", "attempt"])
    )


def _retry_step_update(status: str) -> Update:
    return (
        sa.update(steps)
        .where(steps.c.workflow_step_id == P("step_id"))
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
    step = _retry_step_update(status).returning(*_STEP_COLUMNS).cte("step")
    values: dict[str, Any] = {
        "history_id": _typed("history_id", history.c.history_id),
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
    return sa.select(*step.c).add_cte(add.cte("attempt"))


@cache
def retry_attempt_sqlite(status: str) -> Update:
    return _retry_step_update(status).returning(*_STEP_COLUMNS)


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
    .select_from(steps.join(history, history.c.workflow_step_id == steps.c.workflow_step_id))
    .where(steps.c.workflow_run_id == P("run_id"))
    # Steps in the order they were created, each step's attempts in number order.
    .order_by(steps.c.created_at, steps.c.workflow_step_id, history.c.attempt)
)


# --- versions ---------------------------------------------------------------


@cache
def upsert_workflow_version(dialect: str) -> Insert:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        insert(versions)
        .on_conflict_do_nothing(index_elements=["workflow_name", "graph_hash"])
        .returning(versions.c.workflow_name)
    )


get_workflow_version: Final = sa.select(*versions.c).where(
    versions.c.workflow_name == P("workflow_name"), versions.c.graph_hash == P("graph_hash")
)

update_workflow_version_status: Final = (
    sa.update(versions)
    .where(
        versions.c.workflow_name == P("name"),
        versions.c.graph_hash == P("hash"),
    )
    .values(status=P("new_status"))
)
