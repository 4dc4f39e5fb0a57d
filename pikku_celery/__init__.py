"""pikku-celery: a workflow backend for Celery, mirrored into SQL."""

from __future__ import annotations

from importlib import metadata as _metadata

from pikku_celery.app import PikkuCelery
from pikku_celery.errors import (
    ConfigurationError,
    EventTimeout,
    InvalidDuration,
    InvalidStatus,
    LayoutUnavailable,
    NeverIdle,
    NotAWorkflowRun,
    NotFoundError,
    NotInAStep,
    PayloadTooLarge,
    PikkuCeleryError,
    RunCancelled,
    RunFailed,
    RunIdTaken,
    RunNotFound,
    RunNotOnReplicaYet,
    RunSettled,
    SchemaNotCurrent,
    SerializationError,
    StepFailed,
    StepMismatch,
    StepNotFound,
    StoreConflict,
    StoreError,
    StoreUnavailable,
    Transient,
    UnreadableValue,
    VersionConflict,
    VersionNotFound,
    WaitTimeout,
    WorkflowError,
)
from pikku_celery.integration.step_info import StepInfo, current_step
from pikku_celery.integration.task import WorkflowTask
from pikku_celery.store import StepAttempt, StepState, WorkflowRun, WorkflowStore, WorkflowVersion
from pikku_celery.workflows.definition import Workflow

# The version is written once, in pyproject.toml; the installed metadata carries it here.
try:
    __version__ = _metadata.version("pikku-celery")
except _metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ConfigurationError",
    "EventTimeout",
    "InvalidDuration",
    "InvalidStatus",
    "LayoutUnavailable",
    "NeverIdle",
    "NotAWorkflowRun",
    "NotFoundError",
    "NotInAStep",
    "PayloadTooLarge",
    "PikkuCelery",
    "PikkuCeleryError",
    "RunCancelled",
    "RunFailed",
    "RunIdTaken",
    "RunNotFound",
    "RunNotOnReplicaYet",
    "RunSettled",
    "SchemaNotCurrent",
    "SerializationError",
    "StepAttempt",
    "StepFailed",
    "StepInfo",
    "StepMismatch",
    "StepNotFound",
    "StepState",
    "StoreConflict",
    "StoreError",
    "StoreUnavailable",
    "Transient",
    "UnreadableValue",
    "VersionConflict",
    "VersionNotFound",
    "WaitTimeout",
    "Workflow",
    "WorkflowError",
    "WorkflowRun",
    "WorkflowStore",
    "WorkflowTask",
    "WorkflowVersion",
    "__version__",
    "current_step",
]
