"""Statements for durable workflows: claiming a step under its exact name, once."""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from sqlalchemy.sql.dml import Insert

from pikku_celery.schema import workflow_runs as runs
from pikku_celery.schema import workflow_step as steps
from pikku_celery.store.sql.spelling import Upsert

__all__ = ["claim_step", "get_step", "move_run", "take_pending"]

P = sa.bindparam


def claim_step(insert: Upsert) -> Insert:
    """The step row, unless the run has that name (or that id) already: the claim."""
    statement: Insert = insert(steps).on_conflict_do_nothing().returning(steps.c.workflow_step_id)
    return statement


# A step made pending again (resume, rerun) is dispatched by the one replay
# whose guarded update moves it on; any other replay sees 0 rows and waits.
take_pending: Final = (
    sa.update(steps)
    .where(
        steps.c.workflow_step_id == P("step_id"),
        steps.c.status == "pending",
        sa.func.coalesce(steps.c.current_attempt, 1) == P("attempt_no"),
    )
    .values(status="scheduled", updated_at=P("now"))
)


get_step: Final = sa.select(*steps.c).where(steps.c.workflow_step_id == P("step_id"))

# A run changes status only from the statuses the caller expects it in.
move_run: Final = (
    sa.update(runs)
    .where(
        runs.c.workflow_run_id == P("run_id"), runs.c.status.in_(P("from_statuses", expanding=True))
    )
    .values(status=P("new_status"), output=P("output"), error=P("error"), updated_at=P("now"))
)
