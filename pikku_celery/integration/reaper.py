"""The stuck-attempt reaper: attempts whose worker is gone are marked ``lost``.

Celery sends no signal when a pool process is killed (or the whole worker
is), so the attempt it ran stays ``running`` in the mirror for ever unless
someone looks. The reaper asks the workers, in one broadcast, which of the
open attempts' tasks they hold; an attempt that no answering worker holds
(its worker is silent, or its pool process is gone) is ``lost``:

- if Celery will deliver its message again (``acks_late``; for a dead pool
  process also ``reject_on_worker_lost``), the redelivery continues the same
  attempt, recorded as one more delivery; if none comes within
  ``redelivery_grace``, the reaper gives up on it as below;
- otherwise the reaper gives up at once: with retries left the step gets a
  new attempt (its message published again, ``reason`` = ``lost``), else the
  step fails, and with it the run (a durable workflow is replayed instead, so
  the workflow can compensate).

Every write is guarded on what was read, so reapers on several machines at
once move each attempt once; attempts on live workers are never touched.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from celery import Celery

from pikku_celery.integration import headers as h
from pikku_celery.store import WorkflowStore
from pikku_celery.store.models import OpenAttempt, StaleStep

__all__ = ["LOST_ERROR_TYPE", "ReapReport", "Reaper"]

logger = logging.getLogger(__name__)

LOST_ERROR_TYPE: Final = "pikku_celery.WorkerLost"
_CANVAS_HINT: Final = (
    "A step of a chain, group or chord cannot be published again on its own (the rest of "
    "the canvas travels in its message): set acks_late=True and "
    "task_reject_on_worker_lost=True on the task so Celery redelivers it, then publish "
    "the canvas again."
)


@dataclass(slots=True)
class ReapReport:
    """What one pass of the reaper saw and did."""

    checked: int = 0
    workers: list[str] = field(default_factory=list)
    lost: list[OpenAttempt] = field(default_factory=list)
    awaiting_redelivery: list[OpenAttempt] = field(default_factory=list)
    retried: list[OpenAttempt] = field(default_factory=list)
    failed: list[OpenAttempt] = field(default_factory=list)
    stale: list[StaleStep] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def ids(attempts: list[OpenAttempt]) -> list[dict[str, Any]]:
            return [
                {
                    "run_id": a.run_id,
                    "step": a.step_name,
                    "step_id": a.step_id,
                    "attempt": a.attempt,
                    "worker": a.worker,
                }
                for a in attempts
            ]

        return {
            "checked": self.checked,
            "workers": self.workers,
            "lost": ids(self.lost),
            "awaiting_redelivery": ids(self.awaiting_redelivery),
            "retried": ids(self.retried),
            "failed": ids(self.failed),
            "stale_scheduled": [
                {
                    "run_id": s.run_id,
                    "step": s.step_name,
                    "step_id": s.step_id,
                    "scheduled_at": s.scheduled_at.isoformat() if s.scheduled_at else None,
                }
                for s in self.stale
            ],
        }


class Reaper:
    """One reaper pass per :meth:`reap`; see the module docstring for the rules.

    ``idle_for``: an attempt is looked at only after it has been running that
    long (a task that just ended may not have written its outcome yet).
    ``deadline``: an attempt running longer than this is lost even on a live
    worker, and its task is terminated. ``stale_after``: scheduled steps older
    than this are reported. ``replay`` continues a durable workflow whose step
    failed for good.
    """

    def __init__(
        self,
        app: Celery,
        store: WorkflowStore,
        *,
        idle_for: float = 30.0,
        deadline: float | None = None,
        redelivery_grace: float = 3900.0,
        stale_after: float = 600.0,
        reply_timeout: float = 2.0,
        replay: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.idle_for = idle_for
        self.deadline = deadline
        self.redelivery_grace = redelivery_grace
        self.stale_after = stale_after
        self.reply_timeout = reply_timeout
        self.replay = replay

    def reap(self) -> ReapReport:
        report = ReapReport()
        attempts = self.store.open_attempts(idle_for=self.idle_for)
        report.checked = len(attempts)
        if attempts:
            held, workers = self._held([a.task_id or a.step_id for a in attempts])
            report.workers = sorted(workers)
            for attempt in attempts:
                self._judge(attempt, held, workers, report)
        report.stale = self.store.stale_scheduled(older_than=self.stale_after)
        if report.stale:
            logger.warning(
                "pikku-celery: %d scheduled steps have waited more than %ss for a worker; "
                "check that a worker consumes their queue",
                len(report.stale),
                self.stale_after,
                extra={"action": "stale_scheduled", "count": len(report.stale)},
            )
        return report

    def _held(self, task_ids: list[str]) -> tuple[set[str], set[str]]:
        """The task ids some worker holds (running, reserved, or waiting on an ETA)."""
        replies = self.app.control.inspect(timeout=self.reply_timeout).query_task(*task_ids)
        held: set[str] = set()
        for tasks in (replies or {}).values():
            held.update(tasks or {})
        return held, set(replies or {})

    def _task_option(self, attempt: OpenAttempt, option: str) -> bool:
        task = self.app.tasks.get(attempt.rpc_name or "")
        if task is not None:
            return bool(getattr(task, option))
        return bool(self.app.conf.get(f"task_{option}"))

    def _judge(
        self, attempt: OpenAttempt, held: set[str], workers: set[str], report: ReapReport
    ) -> None:
        task_id = attempt.task_id or attempt.step_id
        if attempt.status == "lost":
            if task_id in held:
                return  # redelivered; its running event is on the way
            error = attempt.error or {}
            waited = _seconds_since(error.get("lost_at"))
            if error.get("redelivery_expected") and waited < self.redelivery_grace:
                report.awaiting_redelivery.append(attempt)
                return
            self._give_up(attempt, dict(error), report)
            return

        over_deadline = (
            self.deadline is not None
            and attempt.running_at is not None
            and _seconds_since(attempt.running_at.isoformat()) > self.deadline
        )
        if task_id in held and not over_deadline:
            return
        if over_deadline:
            cause = f"it ran longer than the {self.deadline}s deadline and was terminated"
            redeliver = False
        elif attempt.worker in workers:
            cause = "its pool process is gone (killed, or out of memory)"
            redeliver = self._task_option(attempt, "acks_late") and self._task_option(
                attempt, "reject_on_worker_lost"
            )
        else:
            cause = "its worker does not answer (stopped, killed, or cut off)"
            redeliver = self._task_option(attempt, "acks_late")
        error = {
            "type": LOST_ERROR_TYPE,
            "message": (
                f"Attempt {attempt.attempt} of step {attempt.step_name!r} was lost on "
                f"{attempt.worker or 'an unknown worker'}: {cause}. "
                + (
                    "Celery will deliver the task again; the redelivery continues this attempt."
                    if redeliver
                    else "Celery will not deliver it again."
                )
            ),
            "traceback": None,
            "worker": attempt.worker,
            "pid": attempt.pid,
            "lost_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "redelivery_expected": redeliver,
            "step": attempt.step_name,
        }
        moved = self.store.mark_lost(
            attempt.step_id, attempt.attempt, attempt.delivery_count, error
        )
        if not moved:
            return  # it moved on meanwhile, or another reaper got there first
        report.lost.append(attempt)
        logger.warning(
            "pikku-celery: %s",
            error["message"],
            extra={"action": "attempt_lost", "step_id": attempt.step_id, "run_id": attempt.run_id},
        )
        if over_deadline:
            self.app.control.revoke(task_id, terminate=True)
        if redeliver:
            report.awaiting_redelivery.append(attempt)
        else:
            # A terminated task id is revoked on every worker: a message published
            # again under it would be dropped, so a task over its deadline is not retried.
            self._give_up(attempt, error, report, may_retry=not over_deadline)

    def _give_up(
        self,
        attempt: OpenAttempt,
        error: dict[str, Any],
        report: ReapReport,
        *,
        may_retry: bool = True,
    ) -> None:
        retries = attempt.retries or 0
        can_republish = (
            may_retry and attempt.run_kind in ("task", "workflow") and bool(attempt.rpc_name)
        )
        retry = bool(can_republish) and attempt.attempt <= retries
        if not retry and attempt.run_kind == "canvas":
            error = {**error, "message": f"{error.get('message', '')} {_CANVAS_HINT}"}
        workflow = attempt.run_kind == "workflow"
        if not retry and attempt.run_kind != "canvas":
            why = "No retries are left" if may_retry else "It is not retried"
            then = (
                "the workflow decides (it may compensate), or resume the run "
                "(pikku-celery runs resume)"
                if workflow
                else "publish the task again"
            )
            error = {**error, "message": f"{error.get('message', '')} {why}; {then}."}
        if not self.store.give_up_lost(
            attempt.run_id,
            attempt.step_id,
            attempt.attempt,
            error,
            retry=retry,
            settle_run=not workflow,
        ):
            return
        if retry:
            self._republish(attempt, workflow)
            report.retried.append(attempt)
        else:
            report.failed.append(attempt)
            if workflow and self.replay is not None:
                self.replay(attempt.run_id)

    def _republish(self, attempt: OpenAttempt, workflow: bool) -> None:
        data: Mapping[str, Any] = attempt.data if isinstance(attempt.data, Mapping) else {}
        headers: dict[str, Any] = {h.RUN_ID: attempt.run_id, h.STEP_NAME: attempt.step_name}
        if workflow:
            headers[h.ORCHESTRATED] = True
        # Same task id, and `retries` so the worker's request.retries + 1 is the
        # attempt the store scheduled.
        self.app.send_task(
            attempt.rpc_name or "",
            args=list(data.get("args") or ()),
            kwargs=dict(data.get("kwargs") or {}),
            task_id=attempt.task_id or attempt.step_id,
            retries=attempt.attempt,
            headers=headers,
        )


def _seconds_since(moment: Any) -> float:
    if not isinstance(moment, str):
        return float("inf")
    try:
        then = dt.datetime.fromisoformat(moment)
    except ValueError:
        return float("inf")
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.timezone.utc)
    return (dt.datetime.now(dt.timezone.utc) - then).total_seconds()
