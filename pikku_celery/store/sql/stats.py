"""Read-only statements for the dashboard and the metrics: counts and searches.

Aggregates are computed by the database so a scrape costs one round trip per
figure and nothing survives only in a process's memory.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa

from pikku_celery.schema import workflow_runs as runs
from pikku_celery.schema import workflow_step as steps
from pikku_celery.schema import workflow_step_history as history
from pikku_celery.store.sql.reap import not_a_wait

__all__ = [
    "attempt_counts",
    "attempt_totals",
    "count_runs",
    "lost_steps_by_run",
    "oldest_running_attempt",
    "open_step_counts",
    "run_counts",
    "search_runs",
    "workflow_names",
]

P = sa.bindparam

# An attempt's step: through its run too, the key the two tables share.
_same_step = sa.and_(
    history.c.workflow_run_id == steps.c.workflow_run_id,
    history.c.workflow_step_id == steps.c.workflow_step_id,
)

run_counts: Final = sa.select(runs.c.status, sa.func.count().label("n")).group_by(runs.c.status)

# Per task rather than per step name, so "charge", "charge#2", ... of a canvas
# share one series and the number of series stays bounded.
_step_label = sa.func.coalesce(steps.c.rpc_name, steps.c.step_name).label("step")

attempt_counts: Final = (
    sa.select(_step_label, history.c.status, sa.func.count().label("n"))
    .select_from(history.join(steps, _same_step))
    .group_by(_step_label, history.c.status)
    .order_by(_step_label, history.c.status)
)

attempt_totals: Final = sa.select(
    sa.func.count().label("attempts"),
    sa.func.coalesce(
        sa.func.sum(sa.case((sa.func.coalesce(history.c.attempt, 1) > 1, 1), else_=0)), 0
    ).label("retries"),
)

oldest_running_attempt: Final = sa.select(sa.func.min(history.c.running_at)).where(
    history.c.status == "running"
)

workflow_names: Final = sa.select(runs.c.workflow).distinct().order_by(runs.c.workflow)

# Rendered into the statement as literals, not sent as parameters: a planner
# only uses the partial index idx_workflow_step_open when it can see that the
# query's condition is the index's own (SQLite never can through a "?", and
# PostgreSQL cannot in a generic plan of a prepared statement).
_open_status = steps.c.status.in_(
    P("open_statuses", ("scheduled", "running", "lost"), expanding=True, literal_execute=True)
)


def _count_where(condition: sa.ColumnElement[bool]) -> sa.ColumnElement[int]:
    return sa.func.coalesce(sa.func.sum(sa.case((condition, 1), else_=0)), 0)


# Same test as the reaper's stale-message report, so the figure and the list
# it points to agree: untouched since "before", and not held back by an ETA
# until then either.
_stale_scheduled = sa.and_(
    steps.c.status == "scheduled",
    steps.c.updated_at < P("before"),
    not_a_wait,
    sa.or_(history.c.eta.is_(None), history.c.eta < P("before")),
)

open_step_counts: Final = (
    sa.select(
        _count_where(steps.c.status == "lost").label("lost"),
        _count_where(steps.c.status == "running").label("running"),
        _count_where(_stale_scheduled).label("stale_scheduled"),
    )
    .select_from(
        steps.outerjoin(
            history,
            sa.and_(
                _same_step,
                history.c.attempt == sa.func.coalesce(steps.c.current_attempt, 1),
            ),
        )
    )
    .where(_open_status)
)

lost_steps_by_run: Final = (
    sa.select(steps.c.workflow_run_id, sa.func.count().label("n"))
    .where(
        steps.c.status == "lost",
        steps.c.workflow_run_id.in_(P("run_ids", expanding=True)),
    )
    .group_by(steps.c.workflow_run_id)
)


def _filtered(
    query: sa.Select[Any], by_workflow: bool, by_status: bool, by_prefix: bool
) -> sa.Select[Any]:
    if by_workflow:
        query = query.where(runs.c.workflow == P("workflow"))
    if by_status:
        query = query.where(runs.c.status.in_(P("statuses", expanding=True)))
    if by_prefix:
        query = query.where(runs.c.workflow_run_id.like(P("id_pattern"), escape="\\"))
    return query


@cache
def count_runs(by_workflow: bool, by_status: bool, by_prefix: bool) -> sa.Select[Any]:
    query = sa.select(sa.func.count()).select_from(runs)
    return _filtered(query, by_workflow, by_status, by_prefix)


@cache
def search_runs(by_workflow: bool, by_status: bool) -> sa.Select[Any]:
    query = _filtered(sa.select(*runs.c), by_workflow, by_status, by_prefix=True)
    return (
        query.order_by(runs.c.created_at.desc(), runs.c.workflow_run_id.desc())
        .limit(P("limit"))
        .offset(P("offset"))
    )
