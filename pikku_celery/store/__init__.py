"""The SQL mirror: schema-backed reads and transactional writes. Knows nothing of Celery.

This module is the store's one face: other layers import what ``__all__`` lists
from here, never from the store's modules (``make check`` holds them to it).
"""

from __future__ import annotations

from pikku_celery.store.attempts import NewRun
from pikku_celery.store.batch_pieces import KeyGroups, PartlyWritten
from pikku_celery.store.codec import error_document
from pikku_celery.store.common import ErrorLike, now
from pikku_celery.store.engine import (
    DEFAULT_DATABASE_URL,
    ENV_DATABASE_URL,
    ENV_READ_DATABASE_URL,
    database_key,
    require_existing_database,
    safe_url,
    same_database,
)
from pikku_celery.store.mirror_batch import (
    BatchResult,
    ChordWrite,
    FiredChord,
    Handover,
    MirrorBatch,
    NewStep,
    ResultWrite,
    RunOutcome,
    StepTransition,
)
from pikku_celery.store.models import (
    CHILD_RPC_PREFIX,
    LOST_ERROR_TYPE,
    NEXT_ATTEMPT_GAP,
    RUN_STATUSES,
    SETTLED_RUN_STATUSES,
    SLEEP_RPC,
    STATUS_RANK,
    WAIT_RPC,
    OpenAttempt,
    RunEvent,
    StaleStep,
    StepAttempt,
    StepState,
    UnsentClaim,
    WorkflowRun,
    WorkflowVersion,
    run_kind,
)
from pikku_celery.store.prune import DEFAULT_PRUNE_STATUSES, PruneCount
from pikku_celery.store.replica import ReplicaLag
from pikku_celery.store.result_watch import ResultWatch, Wakeups
from pikku_celery.store.results import StoredResult
from pikku_celery.store.stats import AttemptCount, AttemptTotals, OpenStepCounts
from pikku_celery.store.workflow_store import PUBLIC_METHODS, UNSET, WorkflowStore
from pikku_celery.store.workflows import child_error

__all__ = [
    "CHILD_RPC_PREFIX",
    "DEFAULT_DATABASE_URL",
    "DEFAULT_PRUNE_STATUSES",
    "ENV_DATABASE_URL",
    "ENV_READ_DATABASE_URL",
    "LOST_ERROR_TYPE",
    "NEXT_ATTEMPT_GAP",
    "PUBLIC_METHODS",
    "RUN_STATUSES",
    "SETTLED_RUN_STATUSES",
    "SLEEP_RPC",
    "STATUS_RANK",
    "UNSET",
    "WAIT_RPC",
    "AttemptCount",
    "AttemptTotals",
    "BatchResult",
    "ChordWrite",
    "ErrorLike",
    "FiredChord",
    "Handover",
    "KeyGroups",
    "MirrorBatch",
    "NewRun",
    "NewStep",
    "OpenAttempt",
    "OpenStepCounts",
    "PartlyWritten",
    "PruneCount",
    "ReplicaLag",
    "ResultWatch",
    "ResultWrite",
    "RunEvent",
    "RunOutcome",
    "StaleStep",
    "StepAttempt",
    "StepState",
    "StepTransition",
    "StoredResult",
    "UnsentClaim",
    "Wakeups",
    "WorkflowRun",
    "WorkflowStore",
    "WorkflowVersion",
    "child_error",
    "database_key",
    "error_document",
    "now",
    "require_existing_database",
    "run_kind",
    "safe_url",
    "same_database",
]
