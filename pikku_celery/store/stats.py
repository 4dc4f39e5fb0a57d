"""Read-only aggregates and searches over the mirror, for the dashboard and metrics."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from pikku_celery.store import sql
from pikku_celery.store.common import check_page, like_prefix, now, run_statuses
from pikku_celery.store.connector import Connector
from pikku_celery.store.models import WorkflowRun

__all__ = ["AttemptCount", "AttemptTotals", "OpenStepCounts", "Stats"]


@dataclass(frozen=True, slots=True)
class AttemptCount:
    """How many attempts of one task (its rpc name, else its step name) are in one status."""

    step: str
    status: str
    count: int


@dataclass(frozen=True, slots=True)
class AttemptTotals:
    """Every attempt, and those of them that were retries (attempt number above 1)."""

    attempts: int
    retries: int

    @property
    def retry_ratio(self) -> float:
        return self.retries / self.attempts if self.attempts else 0.0


@dataclass(frozen=True, slots=True)
class OpenStepCounts:
    """Unfinished steps that may need a person: lost, running, and scheduled but never taken.

    ``lost``: the worker running the step's attempt died or stopped answering
    (the reaper found it). ``stale_scheduled``: scheduled for longer than the
    threshold asked for, ETA included, and no worker has started it.
    """

    lost: int
    running: int
    stale_scheduled: int


class Stats:
    """Counts and searches for the dashboard, the CLI and metrics."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def run_counts(self, *, conn: sa.Connection | None = None) -> dict[str, int]:
        """How many runs are in each status; a status with no run is absent."""
        with self._db.read(conn) as c:
            return {row.status: int(row.n) for row in c.execute(sql.stats.run_counts)}

    def attempt_counts(self, *, conn: sa.Connection | None = None) -> list[AttemptCount]:
        """Attempts by task and status, sorted by task then status."""
        with self._db.read(conn) as c:
            return [
                AttemptCount(step=row.step, status=row.status, count=int(row.n))
                for row in c.execute(sql.stats.attempt_counts)
            ]

    def attempt_totals(self, *, conn: sa.Connection | None = None) -> AttemptTotals:
        with self._db.read(conn) as c:
            row = c.execute(sql.stats.attempt_totals).one()
        return AttemptTotals(attempts=int(row.attempts), retries=int(row.retries))

    def oldest_running_attempt_age(
        self, *, at: dt.datetime | None = None, conn: sa.Connection | None = None
    ) -> float | None:
        """Seconds since the oldest attempt still running started (None: nothing runs)."""
        with self._db.read(conn) as c:
            started: dt.datetime | None = c.execute(sql.stats.oldest_running_attempt).scalar()
        if started is None:
            return None
        return max(0.0, ((at or now()) - started).total_seconds())

    def count_open_steps(
        self,
        stale_after: float,
        *,
        at: dt.datetime | None = None,
        conn: sa.Connection | None = None,
    ) -> OpenStepCounts:
        """How many steps are lost, running, and scheduled untouched for ``stale_after`` s.

        A scheduled step counts as stale on the same test as ``stale_scheduled``
        lists it, so the count and that list agree.
        """
        if not (math.isfinite(stale_after) and stale_after >= 0):
            raise ValueError(f"stale_after must be 0 or more seconds, not {stale_after!r}.")
        try:
            before = (at or now()) - dt.timedelta(seconds=stale_after)
        except OverflowError:
            raise ValueError(f"stale_after is too long: {stale_after!r} seconds.") from None
        with self._db.read(conn) as c:
            row = c.execute(sql.stats.open_step_counts, {"before": before}).one()
        return OpenStepCounts(
            lost=int(row.lost), running=int(row.running), stale_scheduled=int(row.stale_scheduled)
        )

    def lost_steps_by_run(
        self, run_ids: Iterable[str], *, conn: sa.Connection | None = None
    ) -> dict[str, int]:
        """How many ``lost`` steps each of these runs has; a run with none is absent."""
        wanted = list(dict.fromkeys(run_ids))
        if not wanted:
            return {}
        with self._db.read(conn) as c:
            rows = c.execute(sql.stats.lost_steps_by_run, {"run_ids": wanted})
            return {str(row.workflow_run_id): int(row.n) for row in rows}

    def workflow_names(self, *, conn: sa.Connection | None = None) -> list[str]:
        """Every workflow name that has a run, sorted."""
        with self._db.read(conn) as c:
            return [str(name) for name in c.execute(sql.stats.workflow_names).scalars()]

    def count_runs(
        self,
        *,
        workflow: str | None = None,
        status: str | Sequence[str] | None = None,
        run_id_prefix: str | None = None,
        conn: sa.Connection | None = None,
    ) -> int:
        """How many runs ``list_runs`` (or ``search_runs``) with these filters pages through."""
        statuses = run_statuses(status)
        params: dict[str, Any] = {
            "workflow": workflow,
            "statuses": statuses,
            "id_pattern": None if run_id_prefix is None else like_prefix(run_id_prefix),
        }
        query = sql.stats.count_runs(
            workflow is not None, bool(statuses), run_id_prefix is not None
        )
        with self._db.read(conn) as c:
            return int(c.execute(query, params).scalar_one())

    def search_runs(
        self,
        run_id_prefix: str,
        *,
        workflow: str | None = None,
        status: str | Sequence[str] | None = None,
        limit: int = 50,
        offset: int = 0,
        conn: sa.Connection | None = None,
    ) -> list[WorkflowRun]:
        """Runs whose id starts with ``run_id_prefix``, newest first, like ``list_runs``."""
        check_page(limit, offset)
        statuses = run_statuses(status)
        params: dict[str, Any] = {
            "workflow": workflow,
            "statuses": statuses,
            "id_pattern": like_prefix(run_id_prefix),
            "limit": limit,
            "offset": offset,
        }
        query = sql.stats.search_runs(workflow is not None, bool(statuses))
        with self._db.read(conn) as c:
            rows = c.execute(query, params).mappings().all()
        return [WorkflowRun.from_row(row) for row in rows]
