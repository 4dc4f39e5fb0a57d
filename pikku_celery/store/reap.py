"""Store side of the stuck-attempt reaper: find open attempts, mark them lost, give up.

Deciding *whether* an attempt is lost needs Celery (which workers answer,
what they run); that lives in ``integration.reaper``. Here are only the
guarded writes, so any number of reapers can run at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from pikku_celery.store import sql
from pikku_celery.store.attempts import Attempts
from pikku_celery.store.common import now
from pikku_celery.store.connector import Connector
from pikku_celery.store.models import NEXT_ATTEMPT_GAP, OpenAttempt, StaleStep, UnsentClaim

__all__ = ["Reaping"]


class Reaping:
    """The reaper's reads and guarded writes: open attempts, lost ones, unsent claims."""

    def __init__(self, db: Connector, attempts: Attempts) -> None:
        self._db = db
        self._attempts = attempts

    def open_attempts(
        self, *, idle_for: float = 0.0, limit: int = 1000, conn: sa.Connection | None = None
    ) -> list[OpenAttempt]:
        """Current attempts that are ``running`` or ``lost`` and unchanged for ``idle_for`` s."""
        before = now() - dt.timedelta(seconds=idle_for)
        with self._db.read(conn) as c:
            rows = c.execute(sql.reap.open_attempts, {"before": before, "limit": limit}).mappings()
            return [OpenAttempt.from_row(row) for row in rows]

    def stale_scheduled(
        self, *, older_than: float, limit: int = 1000, conn: sa.Connection | None = None
    ) -> list[StaleStep]:
        """Scheduled steps whose message nobody consumed for ``older_than`` seconds."""
        before = now() - dt.timedelta(seconds=older_than)
        with self._db.read(conn) as c:
            rows = c.execute(
                sql.reap.stale_scheduled, {"before": before, "limit": limit}
            ).mappings()
            return [StaleStep.from_row(row) for row in rows]

    def unsent_claims(
        self, *, older_than: float, limit: int = 1000, conn: sa.Connection | None = None
    ) -> list[UnsentClaim]:
        """Steps claimed by a replay ``older_than`` seconds ago whose message never went out."""
        before = now() - dt.timedelta(seconds=older_than)
        with self._db.read(conn) as c:
            rows = c.execute(sql.reap.unsent_claims, {"before": before, "limit": limit}).mappings()
            return [UnsentClaim.from_row(row) for row in rows]

    def retake_claim(
        self,
        step_id: str,
        attempt: int,
        seen: dt.datetime,
        *,
        run_id: str | None = None,
        conn: sa.Connection | None = None,
    ) -> bool:
        """True for the one caller that is to send this unsent claim's message now.

        ``seen``: the claim's ``scheduled_at`` as the caller read it. ``run_id``: the
        step's run, as the scan read it (else looked up by the step's id).
        """
        params = {
            "run_id": run_id,
            "step_id": step_id,
            "attempt_no": attempt,
            "seen": seen,
            "now": now(),
        }
        with self._db.single(conn) as c:
            params["run_id"] = self._attempts.run_of(c, step_id, run_id)
            return bool(c.execute(sql.reap.retake_unsent, params).rowcount)

    def retake_lost(
        self,
        step_id: str,
        attempt: int,
        seen: dt.datetime,
        *,
        run_id: str | None = None,
        conn: sa.Connection | None = None,
    ) -> bool:
        """True for the one caller that is to send this lost step (again) now.

        ``seen``: the step's ``updated_at`` as the caller read it. ``run_id``: the
        step's run, as the scan read it (else looked up by the step's id).
        """
        params = {
            "run_id": run_id,
            "step_id": step_id,
            "attempt_no": attempt,
            "seen": seen,
            "now": now(),
        }
        with self._db.single(conn) as c:
            params["run_id"] = self._attempts.run_of(c, step_id, run_id)
            return bool(c.execute(sql.reap.retake_lost, params).rowcount)

    def unsettled_runs(
        self,
        workflows: list[str],
        *,
        after: str = "",
        limit: int = 500,
        conn: sa.Connection | None = None,
    ) -> list[str]:
        """Ids of the running or suspended runs of ``workflows``, after ``after``, in id order."""
        if not workflows:
            return []
        params = {"workflows": workflows, "after": after, "limit": limit}
        with self._db.read(conn) as c:
            return [str(run_id) for run_id in c.execute(sql.reap.unsettled_runs, params).scalars()]

    def mark_lost(
        self,
        step_id: str,
        attempt: int,
        delivery_count: int,
        error: Mapping[str, Any],
        *,
        run_id: str | None = None,
        conn: sa.Connection | None = None,
    ) -> bool:
        """``running`` -> ``lost`` for exactly the delivery seen; True if this call moved it.

        ``run_id``: the step's run, as the scan read it (else looked up by the step's id)."""
        params = {
            "run_id": run_id,
            "step_id": step_id,
            "attempt_no": attempt,
            "seen_deliveries": delivery_count,
            "error": self._db.error_json(dict(error)),
            "now": now(),
        }
        with self._db.write(conn) as c:
            params["run_id"] = self._attempts.run_of(c, step_id, run_id)
            if c.execute(sql.reap.lose_attempt, params).rowcount == 0:
                return False
            c.execute(sql.reap.lose_step, params)
        return True

    def give_up_lost(
        self,
        run_id: str,
        step_id: str,
        attempt: int,
        error: Mapping[str, Any],
        *,
        retry: bool,
        settle_run: bool,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Nothing will redeliver lost attempt K: it ends (``failed_at``, still ``lost``), and
        K+1 is scheduled (``retry``) or the step fails.

        True if this call did it; the caller then publishes attempt K+1, or
        lets the run's owner react to the failure. With ``settle_run`` the run
        fails with the step.
        """
        document = self._db.error_json(dict(error))
        moment = now()
        params = {
            "run_id": run_id,
            "step_id": step_id,
            "attempt_no": attempt,
            "error": document,
            "now": moment,
        }
        with self._db.write(conn) as c:
            if c.execute(sql.reap.give_up_step, params).rowcount == 0:
                return False
            # Ended in the transaction that adds the next attempt: never two open at once.
            c.execute(sql.reap.give_up_attempt, params)
            if retry:
                self._attempts.record_attempt(
                    step_id,
                    attempt + 1,
                    "scheduled",
                    reason="lost",
                    task_id=step_id,
                    # Strictly after the lost attempt at a millisecond's precision, which
                    # is what a reader comparing JavaScript Dates takes as newer.
                    at=moment + NEXT_ATTEMPT_GAP,
                    run_id=run_id,
                    conn=c,
                )
            elif settle_run:
                self._attempts.settle_run(run_id, "failed", dict(error), conn=c)
        return True
