"""Statements of the mirror's group commit that the single-event writes do not have.

The transitions and new steps themselves reuse ``attempt_queries``: each is
sent once per batch with many parameter sets (psycopg runs those in pipeline
mode, one round trip), so a batch and a lone event obey the same guards.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from pikku_celery.schema import mirror_deliveries as deliveries
from pikku_celery.schema import workflow_runs as runs
from pikku_celery.schema import workflow_step as steps

__all__ = ["count_deliveries", "known_runs", "known_steps", "prune_deliveries"]

P = sa.bindparam

#: The steps a batch names, with what resolving an event needs: its current
#: attempt and its run (and whether that run is a durable workflow's).
known_steps: Final = (
    sa.select(
        steps.c.workflow_step_id,
        steps.c.current_attempt,
        steps.c.workflow_run_id,
        runs.c.wire,
    )
    .join(runs, runs.c.workflow_run_id == steps.c.workflow_run_id)
    .where(steps.c.workflow_step_id.in_(P("step_ids", expanding=True)))
)

known_runs: Final = sa.select(runs.c.workflow_run_id).where(
    runs.c.workflow_run_id.in_(P("run_ids", expanding=True))
)


@cache
def count_deliveries(dialect: str) -> Insert:
    """Record delivery events by id; RETURNING gives the ones not counted before."""
    insert: Any = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(deliveries)
    statement: Insert = insert.on_conflict_do_nothing(index_elements=["event_id"]).returning(
        deliveries.c.event_id
    )
    return statement


prune_deliveries: Final = sa.delete(deliveries).where(deliveries.c.created_at < P("before"))
