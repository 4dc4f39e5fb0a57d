"""pikku-celery: a workflow backend for Celery, mirrored into SQL."""

from __future__ import annotations

from pikku_celery.errors import (
    ConfigurationError,
    PayloadTooLarge,
    PikkuCeleryError,
    RunNotFound,
    SchemaNotCurrent,
    SerializationError,
    StepAlreadyExists,
    StepNotFound,
    StoreConflict,
    StoreError,
    StoreUnavailable,
)
from pikku_celery.integration.app import PikkuCelery
from pikku_celery.integration.task import WorkflowTask
from pikku_celery.store import StepAttempt, StepState, WorkflowRun, WorkflowStore, WorkflowVersion

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "PayloadTooLarge",
    "PikkuCelery",
    "PikkuCeleryError",
    "RunNotFound",
    "SchemaNotCurrent",
    "SerializationError",
    "StepAlreadyExists",
    "StepAttempt",
    "StepNotFound",
    "StepState",
    "StoreConflict",
    "StoreError",
    "StoreUnavailable",
    "WorkflowRun",
    "WorkflowStore",
    "WorkflowTask",
    "WorkflowVersion",
    "__version__",
]
