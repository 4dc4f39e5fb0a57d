"""The stuck-attempt reaper: attempts whose worker is gone are marked ``lost`` and handled.

Celery sends no signal when a pool process is killed (or the whole worker
is), so the attempt it ran stays ``running`` in the mirror for ever unless
someone looks. The reaper asks the workers with pikku-celery
(:mod:`~pikku_celery.integration.control`) which of the open attempts'
tasks they hold and which still have events in their journals. An attempt
that no answering worker holds or journals is ``lost``, and its worker is
gone in one of three ways: its pool process died (the worker answers), its
worker restarted (the worker's name answers from a process started after the
attempt began), or its worker does not answer at all.

- **A durable workflow's step** whose whole worker is gone is dispatched again
  at once, under the same task id and attempt, when the broker would otherwise
  hold its message back until ``visibility_timeout`` (Redis, SQS). That is
  safe: a step that already succeeded answers a late duplicate with its stored
  result and never runs again. Its interrupted execution runs again
  (at-least-once).
- Otherwise, if Celery will deliver the message again (``acks_late``; for a
  dead pool process also ``reject_on_worker_lost``), the redelivery continues
  the same attempt, recorded as one more delivery; if none comes within
  ``redelivery_grace``, the reaper gives up on it as below. A step of a
  chain, group or chord is never dispatched on its own (the rest of the canvas
  travels in its message): it waits for its redelivery, and the report says
  when that is due.
- Otherwise the reaper gives up at once: with retries left the step gets a
  new attempt (its message published again, ``reason`` = ``lost``), else the
  step fails, and with it the run (a durable workflow is replayed instead, so
  the workflow can compensate).

A step that a replay claimed but whose message never went out (the replay
died between the two) is sent by the reaper once its dispatch is overdue.

Every write is guarded on what was read, so reapers on several machines at
once move each attempt once; attempts on live workers are never touched.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from celery import Celery

from pikku_celery.integration import control
from pikku_celery.integration import headers as h
from pikku_celery.store import (
    LOST_ERROR_TYPE,
    SLEEP_RPC,
    OpenAttempt,
    StaleStep,
    UnsentClaim,
    WorkflowStore,
)

__all__ = ["ReapReport", "Reaper", "visibility_timeout"]

logger = logging.getLogger(__name__)

_CANVAS_HINT: Final = (
    "A step of a chain, group or chord cannot be published again on its own (the rest of "
    "the canvas travels in its message): set acks_late=True and "
    "task_reject_on_worker_lost=True on the task so Celery redelivers it, then publish "
    "the canvas again."
)
# Brokers that hand an unacknowledged message of a dead consumer out again only
# after its visibility timeout; RabbitMQ does so as soon as the connection drops.
_VISIBILITY_DEFAULTS: Final = {"redis": 3600.0, "rediss": 3600.0, "sqs": 1800.0}


def visibility_timeout(app: Celery) -> float | None:
    """Seconds the broker holds a dead worker's unacknowledged message back; None: no wait."""
    with app.connection_for_write() as connection:
        driver = str(getattr(connection.transport, "driver_type", "") or "")
    default = _VISIBILITY_DEFAULTS.get(driver)
    if default is None:
        return None
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", default))


def _attempt_entry(a: OpenAttempt) -> dict[str, Any]:
    return {
        "run_id": a.run_id,
        "step": a.step_name,
        "step_id": a.step_id,
        "attempt": a.attempt,
        "worker": a.worker,
    }


@dataclass(slots=True)
class ReapReport:
    """What one pass of the reaper saw and did.

    ``redelivery_due``: for attempts awaiting their broker's redelivery, when
    it is due (step id to time); none for a broker that redelivers at once.
    """

    checked: int = 0
    workers: list[str] = field(default_factory=list)
    lost: list[OpenAttempt] = field(default_factory=list)
    awaiting_redelivery: list[OpenAttempt] = field(default_factory=list)
    redelivery_due: dict[str, dt.datetime] = field(default_factory=dict)
    redispatched: list[OpenAttempt] = field(default_factory=list)
    retried: list[OpenAttempt] = field(default_factory=list)
    failed: list[OpenAttempt] = field(default_factory=list)
    unsent_sent: list[UnsentClaim] = field(default_factory=list)
    stale: list[StaleStep] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def ids(attempts: list[OpenAttempt]) -> list[dict[str, Any]]:
            return [_attempt_entry(a) for a in attempts]

        awaiting = []
        for a in self.awaiting_redelivery:
            due = self.redelivery_due.get(a.step_id)
            awaiting.append(_attempt_entry(a) | {"redelivery_due_at": due and due.isoformat()})
        return {
            "checked": self.checked,
            "workers": self.workers,
            "lost": ids(self.lost),
            "awaiting_redelivery": awaiting,
            "redispatched": ids(self.redispatched),
            "retried": ids(self.retried),
            "failed": ids(self.failed),
            "unsent_sent": [
                {"run_id": c.run_id, "step": c.step_name, "step_id": c.step_id}
                for c in self.unsent_sent
            ],
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


@dataclass(frozen=True, slots=True)
class _Gone:
    """How an attempt's execution was lost, and what Celery does about its message."""

    cause: str
    redeliver: bool
    whole_worker: bool
    over_deadline: bool = False


class Reaper:
    """One reaper pass per :meth:`reap`; see the module docstring for the rules.

    ``idle_for``: an attempt is looked at only after it has been running that
    long. ``deadline``: an attempt running longer than this is lost even on a
    live worker, and its task is terminated. ``redelivery_grace``: how long a
    lost attempt may wait for its redelivery (default: the broker's
    ``visibility_timeout`` plus 5 minutes). ``stale_after``: scheduled steps
    older than this are reported, and a lost workflow step dispatched again
    that has not started in that time is dispatched once more.
    ``claim_grace``: a claimed step whose message is not out after this long is
    sent. ``replay`` continues a durable workflow whose step failed for good.
    ``dispatched`` is told each workflow step whose message it sent (the mirror
    records the attempt as published).
    """

    def __init__(
        self,
        app: Celery,
        store: WorkflowStore,
        *,
        idle_for: float = 30.0,
        deadline: float | None = None,
        redelivery_grace: float | None = None,
        stale_after: float = 600.0,
        claim_grace: float = 15.0,
        reply_timeout: float = 2.0,
        replay: Callable[[str], None] | None = None,
        dispatched: Callable[[str, int], None] | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.idle_for = idle_for
        self.deadline = deadline
        self._redelivery_grace = redelivery_grace
        self.stale_after = stale_after
        self.claim_grace = claim_grace
        self.reply_timeout = reply_timeout
        self.replay = replay
        self.dispatched = dispatched

    @functools.cached_property
    def visibility_timeout(self) -> float | None:
        return visibility_timeout(self.app)

    @property
    def redelivery_grace(self) -> float:
        if self._redelivery_grace is not None:
            return self._redelivery_grace
        return (self.visibility_timeout or 3600.0) + 300.0

    def _ours(self, rpc_name: str | None) -> bool:
        """A step of a task this app has: several apps may share one database, and only
        the task's own app knows its settings and where its messages go."""
        return bool(rpc_name) and rpc_name in self.app.tasks

    def reap(self) -> ReapReport:
        report = ReapReport()
        attempts = [
            a
            for a in self.store.reaping.open_attempts(idle_for=self.idle_for)
            if self._ours(a.rpc_name)
        ]
        claims = [
            c
            for c in self.store.reaping.unsent_claims(older_than=self.claim_grace)
            # A durable sleep's wake-up is sent by its workflow's replay.
            if c.run_kind == "workflow" and (self._ours(c.rpc_name) or c.rpc_name == SLEEP_RPC)
        ]
        report.checked = len(attempts)
        if attempts or claims:
            view = control.ask(
                self.app,
                [a.task_id or a.step_id for a in attempts] + [c.step_id for c in claims],
                self.reply_timeout,
            )
            report.workers = sorted(view.workers)
            for attempt in attempts:
                self._judge(attempt, view, report)
            for claim in claims:
                self._send_claim(claim, view, report)
        report.stale = self.store.reaping.stale_scheduled(older_than=self.stale_after)
        if report.stale:
            logger.warning(
                "pikku-celery: %d scheduled steps have waited more than %ss for a worker; "
                "check that a worker consumes their queue",
                len(report.stale),
                self.stale_after,
                extra={"action": "stale_scheduled", "count": len(report.stale)},
            )
        return report

    def _task_option(self, attempt: OpenAttempt, option: str) -> bool:
        # Only steps of this app's own tasks are judged (see reap()).
        return bool(getattr(self.app.tasks[attempt.rpc_name or ""], option))

    def _how_gone(self, attempt: OpenAttempt, view: control.ClusterView) -> _Gone:
        over_deadline = (
            self.deadline is not None
            and attempt.running_at is not None
            and _seconds_since(attempt.running_at) > self.deadline
        )
        if over_deadline:
            cause = f"it ran longer than the {self.deadline}s deadline and was terminated"
            return _Gone(cause, redeliver=False, whole_worker=False, over_deadline=True)
        acks_late = self._task_option(attempt, "acks_late")
        if attempt.worker in view.workers:
            since = view.workers[attempt.worker or ""]
            began = attempt.running_at.timestamp() if attempt.running_at else None
            if since is not None and began is not None and began < since:
                cause = (
                    "its worker restarted (the name answers from a process started after the "
                    "attempt began), so the process that ran it is gone"
                )
                return _Gone(cause, redeliver=acks_late, whole_worker=True)
            cause = "its pool process is gone (killed, or out of memory)"
            redeliver = acks_late and self._task_option(attempt, "reject_on_worker_lost")
            return _Gone(cause, redeliver=redeliver, whole_worker=False)
        cause = "its worker does not answer (stopped, killed, or cut off)"
        return _Gone(cause, redeliver=acks_late, whole_worker=True)

    def _may_redispatch(self, attempt: OpenAttempt) -> bool:
        """A workflow step whose broker would hold its message back until visibility_timeout."""
        return (
            attempt.run_kind == "workflow"
            and bool(attempt.rpc_name)
            and self.visibility_timeout is not None
        )

    def _judge(self, attempt: OpenAttempt, view: control.ClusterView, report: ReapReport) -> None:
        task_id = attempt.task_id or attempt.step_id
        if task_id in view.journaled or attempt.step_id in view.journaled:
            return  # it moved on; its events are on their way to SQL
        if attempt.status == "lost":
            self._judge_lost(attempt, view, report)
            return
        gone = self._how_gone(attempt, view)
        if task_id in view.held and not gone.over_deadline:
            return
        redispatch = gone.redeliver and gone.whole_worker and self._may_redispatch(attempt)
        due = self._redelivery_due(attempt, gone)
        then = (
            "It is dispatched again now (a workflow step that already succeeded answers a late "
            "duplicate with its stored result)."
            if redispatch
            else self._redelivery_note(attempt, due)
            if gone.redeliver
            else "Celery will not deliver it again."
        )
        error = {
            "type": LOST_ERROR_TYPE,
            "message": (
                f"Attempt {attempt.attempt} of step {attempt.step_name!r} was lost on "
                f"{attempt.worker or 'an unknown worker'}: {gone.cause}. {then}"
            ),
            "traceback": None,
            "worker": attempt.worker,
            "pid": attempt.pid,
            "lost_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "redelivery_expected": gone.redeliver,
            "redispatched": redispatch,
            "step": attempt.step_name,
        }
        if due is not None and not redispatch:
            error["redelivery_due_at"] = due.isoformat()
        moved = self.store.reaping.mark_lost(
            attempt.step_id, attempt.attempt, attempt.delivery_count, error, run_id=attempt.run_id
        )
        if not moved:
            return  # it moved on meanwhile, or another reaper got there first
        report.lost.append(attempt)
        logger.warning(
            "pikku-celery: %s",
            error["message"],
            extra={"action": "attempt_lost", "step_id": attempt.step_id, "run_id": attempt.run_id},
        )
        if gone.over_deadline:
            self.app.control.revoke(task_id, terminate=True)
        if redispatch:
            self._send_step(attempt, attempt.attempt)
            report.redispatched.append(attempt)
        elif gone.redeliver:
            report.awaiting_redelivery.append(attempt)
            if due is not None:
                report.redelivery_due[attempt.step_id] = due
        else:
            # A terminated task id is revoked on every worker: a message published
            # again under it would be dropped, so a task over its deadline is not retried.
            self._give_up(attempt, error, report, may_retry=not gone.over_deadline)

    def _judge_lost(
        self, attempt: OpenAttempt, view: control.ClusterView, report: ReapReport
    ) -> None:
        if (attempt.task_id or attempt.step_id) in view.held:
            return  # redelivered; its running event is on the way
        error = dict(attempt.error or {})
        seen = attempt.updated_at
        if error.get("redelivery_expected") and self._may_redispatch(attempt) and seen:
            # Lost earlier and not dispatched yet (a pass that died, or an older
            # reaper), or dispatched and still not started after stale_after.
            if (
                not error.get("redispatched") or _seconds_since(seen) > self.stale_after
            ) and self.store.reaping.retake_lost(
                attempt.step_id, attempt.attempt, seen, run_id=attempt.run_id
            ):
                self._send_step(attempt, attempt.attempt)
                report.redispatched.append(attempt)
                return
            report.awaiting_redelivery.append(attempt)
            return
        waited = _seconds_since(error.get("lost_at"))
        if error.get("redelivery_expected") and waited < self.redelivery_grace:
            report.awaiting_redelivery.append(attempt)
            due = error.get("redelivery_due_at")
            if isinstance(due, str):
                report.redelivery_due[attempt.step_id] = dt.datetime.fromisoformat(due)
            return
        self._give_up(attempt, error, report)

    def _redelivery_due(self, attempt: OpenAttempt, gone: _Gone) -> dt.datetime | None:
        if not (gone.redeliver and gone.whole_worker) or self.visibility_timeout is None:
            return None
        began = attempt.running_at or dt.datetime.now(dt.timezone.utc)
        return began + dt.timedelta(seconds=self.visibility_timeout)

    def _redelivery_note(self, attempt: OpenAttempt, due: dt.datetime | None) -> str:
        if due is None:
            return "Celery will deliver the task again; the redelivery continues this attempt."
        kind = (
            "A step of a chain, group or chord cannot be dispatched again on its own (the rest "
            "of the canvas travels in its message), so it"
            if attempt.run_kind == "canvas"
            else "It"
        )
        return (
            f"{kind} waits for the broker to deliver it again, due at "
            f"{due.strftime('%Y-%m-%d %H:%M:%S')} UTC, once the broker's visibility_timeout "
            f"({self.visibility_timeout:.0f}s) has passed; lower "
            "broker_transport_options['visibility_timeout'] (above your longest task) to "
            "wait less. The redelivery continues this attempt."
        )

    def _send_claim(
        self, claim: UnsentClaim, view: control.ClusterView, report: ReapReport
    ) -> None:
        if claim.step_id in view.held or claim.step_id in view.journaled:
            return  # its message is out: a worker has it, or its dispatch is on the way to SQL
        if claim.scheduled_at is None or not self.store.reaping.retake_claim(
            claim.step_id, claim.attempt, claim.scheduled_at, run_id=claim.run_id
        ):
            return
        logger.warning(
            "pikku-celery: step %r of run %s was claimed by a replay that died before it sent "
            "the step; sending it now",
            claim.step_name,
            claim.run_id,
            extra={"action": "unsent_step_sent", "step_id": claim.step_id, "run_id": claim.run_id},
        )
        if claim.rpc_name in self.app.tasks:
            self._send(
                claim.run_id,
                claim.step_id,
                claim.step_name,
                claim.rpc_name,
                claim.data,
                claim.attempt,
                routing=claim.routing,
            )
        elif self.replay is not None:
            self.replay(claim.run_id)  # a durable sleep: the replay sends its wake-up
        report.unsent_sent.append(claim)

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
                f"(pikku-celery runs resume {attempt.run_id} --app module:pikku)"
                if workflow
                else "publish the task again"
            )
            error = {**error, "message": f"{error.get('message', '')} {why}; {then}."}
        if not self.store.reaping.give_up_lost(
            attempt.run_id,
            attempt.step_id,
            attempt.attempt,
            error,
            retry=retry,
            settle_run=not workflow,
        ):
            return
        if retry:
            self._send_step(attempt, attempt.attempt + 1)
            report.retried.append(attempt)
        else:
            report.failed.append(attempt)
            if workflow and self.replay is not None:
                self.replay(attempt.run_id)

    def _send_step(self, attempt: OpenAttempt, attempt_no: int) -> None:
        self._send(
            attempt.run_id,
            attempt.task_id or attempt.step_id,
            attempt.step_name,
            attempt.rpc_name or "",
            attempt.data,
            attempt_no,
            workflow=attempt.run_kind == "workflow",
            routing=attempt.routing,
        )

    def _send(
        self,
        run_id: str,
        step_id: str,
        step_name: str,
        rpc_name: str,
        data: Any,
        attempt_no: int,
        *,
        workflow: bool = True,
        routing: Mapping[str, Any] | None = None,
    ) -> None:
        call: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
        # Where the first message went, not where this app would route the name today
        # (a queue given to apply_async, another app's default queue).
        where: dict[str, Any] = {}
        if routing and routing.get("routing_key") is not None:
            exchange, key = routing.get("exchange") or "", str(routing["routing_key"])
            # The default exchange routes by queue name; Celery's router would otherwise
            # put its default queue in.
            where = {"queue": key} if not exchange else {"exchange": exchange, "routing_key": key}
        self.app.send_task(
            rpc_name,
            args=list(call.get("args") or ()),
            kwargs=dict(call.get("kwargs") or {}),
            **h.step_message(run_id, step_id, step_name, attempt_no, orchestrated=workflow),
            **where,
        )
        if workflow and self.dispatched is not None:
            self.dispatched(step_id, attempt_no)


def _seconds_since(moment: Any) -> float:
    if isinstance(moment, dt.datetime):
        then = moment
    elif isinstance(moment, str):
        try:
            then = dt.datetime.fromisoformat(moment)
        except ValueError:
            return float("inf")
    else:
        return float("inf")
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.timezone.utc)
    return (dt.datetime.now(dt.timezone.utc) - then).total_seconds()
