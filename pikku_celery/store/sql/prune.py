"""Statements that remove settled runs in batches (``pikku-celery prune``).

A batch finds the oldest prunable runs through the ``(status, created_at)``
index, then deletes them by id; their steps and attempts go with them through
``ON DELETE CASCADE``. Each status gets its own ``ORDER BY created_at LIMIT n``
branch: an index range scan that stops after n entries. One branch with
``status IN (...)`` would make PostgreSQL read every prunable entry and sort
them, so each batch would cost as much as the whole backlog.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa

from pikku_celery.schema import workflow_runs as runs
from pikku_celery.schema import workflow_step as steps
from pikku_celery.schema import workflow_step_history as history

__all__ = [
    "count_batch_children",
    "count_prunable",
    "count_prunable_runs",
    "delete_runs",
    "lock_batch",
    "oldest_prunable",
    "status_params",
]

P = sa.bindparam

# An attempt's step: through its run too, the key the two tables share.
_same_step = sa.and_(
    history.c.workflow_run_id == steps.c.workflow_run_id,
    history.c.workflow_step_id == steps.c.workflow_step_id,
)


def status_params(statuses: list[str]) -> dict[str, str]:
    """The bind parameters ``oldest_prunable(len(statuses))`` names, one per status."""
    return {f"status_{i}": status for i, status in enumerate(statuses)}


def _prunable() -> list[sa.ColumnElement[bool]]:
    return [
        runs.c.status.in_(P("statuses", expanding=True)),
        runs.c.created_at < P("before"),
    ]


@cache
def oldest_prunable(status_count: int) -> sa.Select[Any]:
    """The ids of the ``limit`` oldest runs in one of the statuses, created before ``before``."""
    branches = [
        sa.select(runs.c.workflow_run_id, runs.c.created_at)
        .where(runs.c.status == P(f"status_{i}"), runs.c.created_at < P("before"))
        .order_by(runs.c.created_at)
        .limit(P("limit"))
        # A subquery each: SQLite and PostgreSQL only take ORDER BY/LIMIT per branch so.
        .subquery(f"by_status_{i}")
        for i in range(status_count)
    ]
    candidates = sa.union_all(*(sa.select(b.c.workflow_run_id, b.c.created_at) for b in branches))
    merged = candidates.subquery("candidates")
    return (
        sa.select(merged.c.workflow_run_id)
        .order_by(merged.c.created_at, merged.c.workflow_run_id)
        .limit(P("limit"))
    )


# The runs of the batch that are still prunable, locked until the batch commits:
# a run resumed meanwhile is left alone, and a concurrent prune skips these rows.
lock_batch: Final = (
    sa.select(runs.c.workflow_run_id)
    .where(runs.c.workflow_run_id.in_(P("ids", expanding=True)), *_prunable())
    .with_for_update(skip_locked=True)
)

count_batch_children: Final = sa.select(
    sa.select(sa.func.count())
    .select_from(steps)
    .where(steps.c.workflow_run_id.in_(P("ids", expanding=True)))
    .scalar_subquery()
    .label("steps"),
    sa.select(sa.func.count())
    .select_from(history.join(steps, _same_step))
    .where(steps.c.workflow_run_id.in_(P("ids", expanding=True)))
    .scalar_subquery()
    .label("attempts"),
)

delete_runs: Final = sa.delete(runs).where(
    runs.c.workflow_run_id.in_(P("ids", expanding=True)), *_prunable()
)

# Runs only: an index-only count, for a progress bar (the joins below read every step and
# attempt of the backlog, which only a dry run needs).
count_prunable_runs: Final = sa.select(sa.func.count()).select_from(runs).where(*_prunable())

count_prunable: Final = sa.select(
    sa.select(sa.func.count())
    .select_from(runs)
    .where(*_prunable())
    .scalar_subquery()
    .label("runs"),
    sa.select(sa.func.count())
    .select_from(steps.join(runs, steps.c.workflow_run_id == runs.c.workflow_run_id))
    .where(*_prunable())
    .scalar_subquery()
    .label("steps"),
    sa.select(sa.func.count())
    .select_from(
        history.join(steps, _same_step).join(
            runs, steps.c.workflow_run_id == runs.c.workflow_run_id
        )
    )
    .where(*_prunable())
    .scalar_subquery()
    .label("attempts"),
)
