"""How the tables spread over the nodes of a distributed PostgreSQL (Citus's layout).

A distributed table is hash-split by one column, its distribution key; tables
split by the same key value live together on one node, so a statement that names
one key value runs on one node only. The reference tables are small and copied
whole to every node (or kept on the coordinator). Every table of
``tables.metadata`` is in exactly one of the two; the routing test
(``tests/integration/test_routing.py``) builds its hash-partitioned copy of the
schema from these and checks it against the metadata.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DISTRIBUTED", "REFERENCE"]

#: Each hot table and the column its rows are split by.
DISTRIBUTED: Final[dict[str, str]] = {
    "workflow_runs": "workflow_run_id",
    "workflow_step": "workflow_run_id",
    # No run id on an attempt yet: split by its step, so not beside its step's run.
    "workflow_step_history": "workflow_step_id",
    "pikku_celery_run_events": "workflow_run_id",
    "pikku_celery_chords": "workflow_run_id",
    # No run id on a delivery yet: split by the event's own id.
    "pikku_celery_deliveries": "event_id",
    "pikku_celery_results": "task_id",
    "pikku_celery_groups": "group_id",
    "pikku_celery_result_chords": "group_id",
    "pikku_celery_result_chord_parts": "group_id",
}

#: Small tables every node may read: workflow definitions and the cluster's leases.
REFERENCE: Final[frozenset[str]] = frozenset({"workflow_versions", "pikku_celery_leases"})
