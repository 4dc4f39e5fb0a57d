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

__all__ = [
    "attempt_counts",
    "attempt_totals",
    "count_runs",
    "oldest_running_attempt",
    "run_counts",
    "search_runs",
    "workflow_names",
]

P = sa.bindparam

run_counts: Final = sa.select(runs.c.status, sa.func.count().label("n")).group_by(runs.c.status)

# Per task rather than per step name, so "charge", "charge#2", ... of a canvas
# share one series and the number of series stays bounded.
_step_label = sa.func.coalesce(steps.c.rpc_name, steps.c.step_name).label("step")

attempt_counts: Final = (
    sa.select(_step_label, history.c.status, sa.func.count().label("n"))
    .select_from(history.join(steps, history.c.workflow_step_id == steps.c.workflow_step_id))
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
