"""The SQL mirror: schema-backed reads and transactional writes. Knows nothing of Celery."""

from __future__ import annotations

from pikku_celery.store.models import (
    OpenAttempt,
    RunEvent,
    StaleStep,
    StepAttempt,
    StepState,
    UnsentClaim,
    WorkflowRun,
    WorkflowVersion,
)
from pikku_celery.store.workflow_store import UNSET, WorkflowStore

__all__ = [
    "UNSET",
    "OpenAttempt",
    "RunEvent",
    "StaleStep",
    "StepAttempt",
    "StepState",
    "UnsentClaim",
    "WorkflowRun",
    "WorkflowStore",
    "WorkflowVersion",
]
