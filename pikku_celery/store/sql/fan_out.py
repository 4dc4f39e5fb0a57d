"""The statements that may run on every node of a distributed database.

Every other statement of ``store/sql`` names the distribution key of each hot
table it reads or writes (``schema/distribution.py``), so it runs where those
keys live. The routing test (``tests/integration/test_routing.py``) runs every
statement a workload sends against a copy of the schema hash-partitioned by those
keys and fails on one that touches more partitions than its keys, unless it is
named here. A statement is named as ``module.attribute`` of ``store/sql``. The
mirror's batches are judged as the flusher sends them on a distributed layout: one
transaction per group of keys (``store/batch_pieces.py``), a run's completion naming its
runs in every subquery (``batches.complete_runs_keyed_pg``; ``complete_runs_pg``, which
does not, is sent only where the tables are not distributed).
"""

from __future__ import annotations

from typing import Final

__all__ = ["FAN_OUT", "NOT_YET_KEYED"]

_DASHBOARD = "the dashboard's, CLI's and metrics' view of all runs"
_REAPER = "the reaper's scan for what is stuck, by age, wherever it is"
_EXPIRY = "expiry: rows older than a time, wherever they are"
_PRUNE = "prune: finished runs older than a time, wherever they are"
_BY_PART = "a ready result's chord part, by its task id: a result does not know its chord"

#: By design: scans over all runs, each with why.
FAN_OUT: Final[dict[str, str]] = {
    "attempts.step_run": "a direct caller names only the step: its run, looked up once "
    "before the write, which then names it",
    "batches.known_steps_pg": "the batch's one lookup of its steps: an event names its step",
    "batches.prune_deliveries": _EXPIRY,
    "prune.count_prunable": _PRUNE,
    "prune.count_prunable_runs": _PRUNE,
    "prune.oldest_prunable": _PRUNE,
    "reap.open_attempts": _REAPER,
    "reap.stale_scheduled": _REAPER,
    "reap.unsent_claims": _REAPER,
    "reap.unsettled_runs": _REAPER,
    "results.open_chords": _REAPER + " (chords not fired, a page at a time)",
    "results.parts_waiting_for": _BY_PART,
    "results.unsettled_chords": _BY_PART + ", after COMMIT",
    "results.unsent_chords": _REAPER + " (fired chords whose body is not out)",
    "results.expire_results": _EXPIRY,
    "results.expire_groups": _EXPIRY,
    "results.expire_chords": _EXPIRY,
    "results.expire_chord_parts": _EXPIRY + " (parts whose chord is gone)",
    "runs.list_runs": _DASHBOARD,
    "stats.attempt_counts": _DASHBOARD,
    "stats.attempt_totals": _DASHBOARD,
    "stats.count_runs": _DASHBOARD,
    "stats.oldest_running_attempt": _DASHBOARD,
    "stats.open_step_counts": _DASHBOARD,
    "stats.run_counts": _DASHBOARD,
    "stats.search_runs": _DASHBOARD,
    "stats.workflow_names": _DASHBOARD,
}

#: Not keyed yet: each touches more partitions than its keys today, with why. The
#: routing test fails when one of these routes (take it off) so this only shrinks.
_STEP_BY_ID = "finds a step by its id alone; steps are split by run"

NOT_YET_KEYED: Final[dict[str, str]] = {
    "claims.get_step": _STEP_BY_ID,
}
