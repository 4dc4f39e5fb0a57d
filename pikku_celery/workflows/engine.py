"""``WorkflowEngine``: durable workflows on a Celery app.

The orchestrator is a Celery task (``pikku_celery.orchestrate``) that replays
a run; a step's end (success, or failure for good) queues the next replay.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from celery import Celery

from pikku_celery.errors import (
    ConfigurationError,
    NotAWorkflowRun,
    RunCancelled,
    RunFailed,
    RunNotFound,
    StepNotFound,
    WaitTimeout,
)
from pikku_celery.integration import headers as h
from pikku_celery.integration.task import as_task_function
from pikku_celery.mirror import Recorder
from pikku_celery.store import WorkflowRun, WorkflowStore, child_error
from pikku_celery.workflows.context import Dispatcher
from pikku_celery.workflows.definition import Workflow, code_version
from pikku_celery.workflows.inputs import passed_in
from pikku_celery.workflows.reopen import reopen
from pikku_celery.workflows.replay import Outcome, parent_of, replay

__all__ = ["ORCHESTRATE_TASK", "WAKE_TASK", "WorkflowEngine"]

logger = logging.getLogger(__name__)

ORCHESTRATE_TASK: Final = "pikku_celery.orchestrate"
WAKE_TASK: Final = "pikku_celery.wake"
_UNFINISHED: Final = ("pending", "scheduled", "running")


def _gone(message: str, run_id: str) -> None:
    # A message outlives its run when the run is deleted or pruned while the message
    # waits (a wait's deadline, a sleep's wake-up, a replay in the queue): nothing is
    # left to do, and nothing is wrong with the worker, so one line, no traceback.
    logger.warning(
        "pikku-celery dropped a %s message for workflow run %s, which no longer exists "
        "(deleted or pruned); nothing to do.",
        message,
        run_id,
        extra={"action": "message_for_missing_run", "run_id": run_id},
    )


class CeleryDispatcher:
    """Sends a replay's decisions as Celery messages."""

    def __init__(self, app: Celery, dispatched: Callable[[str, int], None]) -> None:
        self.app = app
        # Told once a message is out, by the mirror that claimed its step: a signal
        # handler could not tell which of several apps in a process sent it.
        self.dispatched = dispatched

    def step(
        self,
        run_id: str,
        step_id: str,
        step_name: str,
        task: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        attempt: int,
    ) -> None:
        task.apply_async(
            tuple(args),
            kwargs,
            **h.step_message(run_id, step_id, step_name, attempt, orchestrated=True),
        )
        self.dispatched(step_id, attempt)

    def wake(self, run_id: str, step_id: str, attempt: int, at: dt.datetime) -> None:
        self.app.send_task(WAKE_TASK, (run_id, step_id, attempt), eta=at)
        self.dispatched(step_id, attempt)

    def orchestrate(self, run_id: str, at: dt.datetime | None = None) -> None:
        self.app.send_task(ORCHESTRATE_TASK, (run_id,), eta=at)


class WorkflowEngine:
    def __init__(self, app: Celery, mirror: Recorder) -> None:
        self.app = app
        self._mirror = mirror
        self.dispatcher: Dispatcher = CeleryDispatcher(app, mirror.dispatched)
        self.workflows: dict[str, Workflow] = {}
        orchestrate, wake = as_task_function(self._orchestrate), as_task_function(self._wake)
        app.task(name=ORCHESTRATE_TASK, acks_late=True, ignore_result=True, shared=False)(
            orchestrate
        )
        app.task(name=WAKE_TASK, acks_late=True, ignore_result=True, shared=False)(wake)
        # A step's end replays its run only once that end is committed in SQL,
        # so the replay never reads the step as unfinished.
        mirror.on_committed(self._replay_all)

    def _replay_all(self, run_ids: Sequence[str]) -> None:
        for run_id in run_ids:
            self.dispatcher.orchestrate(run_id)

    @property
    def store(self) -> WorkflowStore:
        return self._mirror.store

    # --- definitions ------------------------------------------------------------

    def define(
        self,
        name: str,
        fn: Callable[..., Any],
        version: str | None,
        compatible: Iterable[str],
    ) -> Workflow:
        if name in self.workflows and self.workflows[name].fn is not fn:
            raise ConfigurationError(f"Two workflows are named {name!r}; give each its own name.")
        workflow = Workflow(
            name=name,
            fn=fn,
            version=version or code_version(fn),
            compatible=frozenset(compatible),
            pinned=bool(version),
            starter=self._start,
        )
        self.workflows[name] = workflow
        return workflow

    def _start(
        self,
        workflow: Workflow,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        run_id: str | None = None,
    ) -> str:
        store = self.store
        store.versions.upsert_workflow_version(
            workflow.name, workflow.version, workflow.graph, "python"
        )
        call = {"args": list(args), "kwargs": kwargs}
        with passed_in(f"input of workflow {workflow.name!r}"):
            if run_id is None:
                run_id = store.create_run(
                    workflow.name, call, graph_hash=workflow.version, wire={"type": "workflow"}
                )
                started = True
            else:
                started = store.workflows.start_run(
                    workflow.name,
                    call,
                    run_id=run_id,
                    graph_hash=workflow.version,
                    wire={"type": "workflow"},
                )
        if not started:  # started before (a retried request): that run is the answer
            self._started_before(workflow, run_id, call)
            return run_id
        self.dispatcher.orchestrate(run_id)
        return run_id

    def _started_before(self, workflow: Workflow, run_id: str, call: dict[str, Any]) -> None:
        """A start under the id of a run that exists: said when its arguments differ, since
        only the first start's are the run's (a retried request passes the same)."""
        recorded = self.store.get_run(run_id).input
        # As the store keeps them: tuples are lists once in JSON.
        if recorded == json.loads(json.dumps(call)):
            return
        logger.warning(
            "workflow %s: run %s was started before with other arguments (%s, now %s); "
            "this start returned that run and its arguments were not used. Give a start "
            "with new arguments a run_id (or idempotency_key) of its own.",
            workflow.name,
            run_id,
            json.dumps(recorded),
            json.dumps(call),
            extra={"action": "start_arguments_differ", "run_id": run_id},
        )

    # --- the Celery tasks -------------------------------------------------------

    def _orchestrate(self, run_id: str) -> str:
        try:
            run = self.store.get_run(run_id)
        except RunNotFound:
            _gone("replay", run_id)
            return "gone"
        if run.kind != "workflow":
            return "settled"  # a canvas or lone task: nothing here replays it
        workflow = self.workflows.get(run.workflow)
        if workflow is None:
            raise ConfigurationError(
                f"Run {run_id!r} belongs to workflow {run.workflow!r}, which this worker "
                "does not define; import the module that declares it in the worker."
            )
        outcome: Outcome = replay(self.store, workflow, run_id, self.dispatcher, run)
        return outcome

    def _wake(self, run_id: str, step_id: str, attempt: int) -> None:
        # A durable sleep's wake-up (a wait's timeout is a plain replay at its deadline).
        try:
            self.store.attempts.record_attempt(step_id, attempt, "succeeded", run_id=run_id)
        except StepNotFound:  # the run went with its steps
            _gone("wake-up", run_id)
            return
        self.dispatcher.orchestrate(run_id)

    def replay_soon(self, run_id: str) -> None:
        """Replay the run (after a write that is committed already: the reaper's)."""
        self.dispatcher.orchestrate(run_id)

    def recover(self, go_on: Callable[[], bool] = lambda: True, page: int = 500) -> int:
        """Replay every unsettled run of the workflows defined here; returns how many.

        Run when a worker starts (one pass for the cluster, see
        ``integration.upkeep``): a run whose next message died with a worker
        (a wake-up, a replay) goes on instead of waiting for ever. Replays are
        idempotent, so a run replayed twice loses nothing. ``go_on`` is asked
        after every page; recovery stops when it says False (its lease is lost).
        """
        count, after = 0, ""
        names = sorted(self.workflows)
        while True:
            run_ids = self.store.reaping.unsettled_runs(names, after=after, limit=page)
            for run_id in run_ids:
                self.dispatcher.orchestrate(run_id)
            count += len(run_ids)
            if len(run_ids) < page or not go_on():
                return count
            after = run_ids[-1]

    @property
    def recovery_lease(self) -> str:
        """The lease of recovery for this set of workflows (apps that share a database
        but not their workflows each recover their own)."""
        digest = hashlib.sha256("\0".join(sorted(self.workflows)).encode()).hexdigest()[:16]
        return f"recovery:{digest}"

    def finished_result(self, step_id: str) -> tuple[bool, Any]:
        """(True, result) when the step already succeeded: a duplicate dispatch of it."""
        try:
            step = self.store.get_step(step_id)
        except StepNotFound:
            return False, None
        return step.status == "succeeded", step.result

    # --- control ----------------------------------------------------------------

    def wait(self, run_id: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            run = self.store.get_run(run_id)
            if run.status == "completed":
                return run.output
            if run.status == "failed":
                raise RunFailed(run_id, run.error, run.kind)
            if run.status == "cancelled":
                raise RunCancelled(run_id)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(run_id, timeout, run.status)
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 1.0)

    def _workflow_run(self, run_id: str) -> WorkflowRun:
        run = self.store.get_run(run_id)
        if run.kind != "workflow":
            raise NotAWorkflowRun(run_id, run.kind)
        return run

    def resume(self, run_id: str) -> list[str]:
        """New attempts for the run's failed steps; the rest is kept. Returns their names."""
        run = self._workflow_run(run_id)
        if run.status == "completed":
            return []
        again = reopen(self.store, run_id)
        self.dispatcher.orchestrate(run_id)
        return again

    def rerun(self, run_id: str, from_step: str) -> list[str]:
        """New attempts for ``from_step`` and every step after it. Returns their names."""
        self._workflow_run(run_id)
        again = reopen(self.store, run_id, from_step=from_step)
        self.dispatcher.orchestrate(run_id)
        return again

    def cancel(self, run_id: str) -> list[str]:
        """Cancel the run, its unfinished child runs, and revoke its unfinished steps.

        Returns the names of the steps it stopped. A cancelled child run fails
        its parent's step (``StepFailed`` at its ``ctx.do``).
        """
        store = self.store
        run = store.get_run(run_id)  # an unknown run is an error, not nothing to cancel
        error = {"type": "Cancelled", "message": "The run was cancelled.", "traceback": None}
        open_steps = [s for s in store.list_step_states(run_id) if s.status in _UNFINISHED]
        parent = parent_of(run)
        with store.transaction() as conn:
            cancelled = store.claims.move_run(
                run_id,
                "cancelled",
                from_statuses=("running", "suspended"),
                error=error,
                conn=conn,
            )
            for step in open_steps:
                store.attempts.record_attempt(
                    step.step_id,
                    step.attempt_count,
                    "cancelled",
                    error=error,
                    run_id=step.run_id,
                    conn=conn,
                )
            if cancelled and parent is not None:
                store.workflows.end_child(
                    parent[1],
                    run_id,
                    "cancelled",
                    error=child_error(run_id, "cancelled", error),
                    conn=conn,
                )
        for step in open_steps:
            if step.child_run_id is not None:
                self.cancel(step.child_run_id)
        tasks = [
            s.step_id for s in open_steps if s.child_run_id is None and s.rpc_name in self.app.tasks
        ]
        if tasks:
            self.app.control.revoke(tasks)
        if cancelled and parent is not None:
            self.dispatcher.orchestrate(parent[0])
        return [step.step_name for step in open_steps]

    # --- events -----------------------------------------------------------------

    def send(self, run_id: str, name: str, data: Any = None) -> str:
        """Send the run an event for its ``ctx.wait_for(name)``; returns the event's id.

        Kept until a wait of that name takes it (each event is taken once), so
        it may come before the workflow reaches its wait. The run is replayed
        once the event is committed.
        """
        run = self._workflow_run(run_id)
        with passed_in(f"data of event {name!r}"):
            event_id = self.store.workflows.send_event(run.run_id, name, data)
        self.dispatcher.orchestrate(run_id)
        return event_id
