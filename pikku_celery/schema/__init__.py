"""The schema layer: the tables (``tables``), the migrations that make them
(``migrations``) and the runner that applies those (``migrate``).

This module is the layer's face: the store imports the tables and types from here.
"""

from __future__ import annotations

from pikku_celery.schema import migrate
from pikku_celery.schema.tables import (
    COMPAT_SCHEMA,
    OPEN_STEP_CONDITION,
    TIMESTAMP_FORMAT,
    Flag,
    JsonText,
    UtcDateTime,
    celery_groups,
    celery_result_chord_parts,
    celery_result_chords,
    celery_results,
    chords,
    format_timestamp,
    leases,
    metadata,
    mirror_deliveries,
    parse_timestamp,
    read_flag,
    run_events,
    sqlite_flag,
    workflow_runs,
    workflow_step,
    workflow_step_history,
    workflow_versions,
)

__all__ = [
    "COMPAT_SCHEMA",
    "OPEN_STEP_CONDITION",
    "TIMESTAMP_FORMAT",
    "Flag",
    "JsonText",
    "UtcDateTime",
    "celery_groups",
    "celery_result_chord_parts",
    "celery_result_chords",
    "celery_results",
    "chords",
    "format_timestamp",
    "leases",
    "metadata",
    "migrate",
    "mirror_deliveries",
    "parse_timestamp",
    "read_flag",
    "run_events",
    "sqlite_flag",
    "workflow_runs",
    "workflow_step",
    "workflow_step_history",
    "workflow_versions",
]
