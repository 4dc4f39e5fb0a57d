"""pikku-celery: a workflow backend for Celery, mirrored into SQL."""

from __future__ import annotations

from pikku_celery.app import PikkuCelery
from pikku_celery.errors import (
    ConfigurationError,
    EventTimeout,
    NotInAStep,
    PayloadTooLarge,
    PikkuCeleryError,
    RunCancelled,
    RunFailed,
    RunIdTaken,
    RunNotFound,
    RunSettled,
    SchemaNotCurrent,
    SerializationError,
    StepAlreadyExists,
    StepFailed,
    StepNotFound,
    StoreConflict,
    StoreError,
    StoreUnavailable,
    WaitTimeout,
)
from pikku_celery.integration.step_info import StepInfo, current_step
from pikku_celery.integration.task import WorkflowTask
from pikku_celery.store import StepAttempt, StepState, WorkflowRun, WorkflowStore, WorkflowVersion

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "EventTimeout",
    "NotInAStep",
    "PayloadTooLarge",
    "PikkuCelery",
    "PikkuCeleryError",
    "RunCancelled",
    "RunFailed",
    "RunIdTaken",
    "RunNotFound",
    "RunSettled",
    "SchemaNotCurrent",
    "SerializationError",
    "StepAlreadyExists",
    "StepAttempt",
    "StepFailed",
    "StepInfo",
    "StepNotFound",
    "StepState",
    "StoreConflict",
    "StoreError",
    "StoreUnavailable",
    "WaitTimeout",
    "WorkflowRun",
    "WorkflowStore",
    "WorkflowTask",
    "WorkflowVersion",
    "__version__",
    "current_step",
]
