"""The run that tasks published right now belong to, when no running task says it."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

__all__ = ["RunContext", "current_run"]


@dataclass(frozen=True, slots=True)
class RunContext:
    """The run that tasks published right now belong to, and the step they follow."""

    run_id: str
    parent_step_id: str | None = None


#: Set by ``PikkuCelery.run`` while it publishes a canvas, and while a chord's body is
#: sent after its last part's result committed (no task runs then to say the run).
current_run: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "pikku_celery_current_run", default=None
)
