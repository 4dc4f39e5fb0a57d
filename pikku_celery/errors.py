"""Every error pikku-celery raises, under one root.

::

    PikkuCeleryError
    ├── ConfigurationError          a setting or URL cannot be used
    │   └── LayoutUnavailable       the database cannot take the table layout asked for
    ├── SerializationError          a value cannot be stored as JSON
    │   └── PayloadTooLarge         a value is larger than the configured limit
    ├── InvalidDuration             a retry delay is not a duration
    ├── UnreadableValue             a row holds a value in no form the data contract reads
    ├── StoreError                  the SQL mirror refused or failed an operation
    │   ├── NotFoundError
    │   │   ├── RunNotFound
    │   │   │   └── RunNotOnReplicaYet  not found on a read replica that is behind
    │   │   ├── StepNotFound
    │   │   └── VersionNotFound
    │   ├── RunIdTaken              a start's run id belongs to a run of another workflow
    │   ├── RunSettled              an event sent to a run that has ended
    │   ├── InvalidStatus           a status outside the allowed set
    │   ├── SchemaNotCurrent        the database schema is behind the code
    │   ├── StoreUnavailable        the database cannot be reached (transient)
    │   └── StoreConflict           rolled back for a concurrent transaction (transient)
    └── WorkflowError               a durable workflow could not go on
        ├── StepFailed              a step failed for good (raised at its ctx.do)
        │   └── EventTimeout        ctx.wait_for(): no event came in time
        ├── NotInAStep              current_step() outside a step
        ├── StepMismatch            a replay asked a recorded step for another task
        ├── VersionConflict         a run started by one version replayed by another
        ├── NotAWorkflowRun         resume/rerun of a run that is not a durable workflow
        ├── RunFailed               pikku.wait(): the run failed
        ├── RunCancelled            pikku.wait(): the run was cancelled
        ├── WaitTimeout             pikku.wait(): the run did not settle in time
        └── NeverIdle               the inline test runner still had messages after its limit

Driver errors stay on ``__cause__``. Each class's docstring is its default
message, and every message says what to do about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    "PikkuCeleryError",
    "RunCancelled",
    "RunFailed",
    "RunIdTaken",
    "RunNotFound",
    "RunNotOnReplicaYet",
    "RunSettled",
    "SchemaNotCurrent",
    "SerializationError",
    "StepFailed",
    "StepMismatch",
    "StepNotFound",
    "StoreConflict",
    "StoreError",
    "StoreUnavailable",
    "Transient",
    "UnreadableValue",
    "VersionConflict",
    "VersionNotFound",
    "WaitTimeout",
    "WorkflowError",
]


class PikkuCeleryError(Exception):
    """pikku-celery failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(PikkuCeleryError):
    """pikku-celery is misconfigured; check the database URL and settings."""


class LayoutUnavailable(ConfigurationError):
    """The database cannot take the table layout asked for; the message says what to do."""


class SerializationError(PikkuCeleryError, ValueError):
    """A value cannot be stored as JSON; pass JSON types (dict, list, str, number, bool, None)."""


class PayloadTooLarge(SerializationError):
    """A value is larger than the store accepts; store a reference to it instead of the value."""


class InvalidDuration(PikkuCeleryError, ValueError):
    """A retry delay is not a duration; give seconds (2, 0.5) or a string such as '5s'."""

    def __init__(self, value: object) -> None:
        self.value = value
        super().__init__(
            f"{value!r} is not a retry delay pikku-celery can store; give seconds as a "
            "number (2, 0.5), a timedelta, or a duration string of a whole number and a "
            "unit ('5s', '200ms', '2min', '1h')."
        )


class UnreadableValue(PikkuCeleryError, ValueError):
    """A row holds a value in no form the data contract reads; correct the row."""

    def __init__(self, kind: str, value: object, expected: str) -> None:
        self.value = value
        super().__init__(
            f"The database holds {value!r} where a {kind} belongs, in no form pikku-celery "
            f"reads; correct that row (write {expected}, see docs/data-contract.md)."
        )


class StoreError(PikkuCeleryError):
    """The workflow store failed."""


class Transient:
    """Marker: the operation may succeed when retried."""


class NotFoundError(StoreError, LookupError):
    """A workflow record does not exist."""


class RunNotFound(NotFoundError):
    """No such workflow run; check the run id (`pikku-celery runs list` shows them)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"Workflow run {run_id!r} does not exist; check the run id "
            "(it may have been deleted or pruned)."
        )


class RunNotOnReplicaYet(RunNotFound):
    """No such workflow run on the read replica, which is behind its primary: the run may
    not be replayed there yet; try again in a moment, or read the primary."""

    def __init__(self, run_id: str, where: str, behind: str) -> None:
        self.run_id = run_id
        NotFoundError.__init__(
            self,
            f"Workflow run {run_id!r} is not on the read replica {where}, which {behind}; "
            "a run just started may not be there yet. Try again in a moment, or read the "
            "primary (leave out --read-database-url / PIKKU_READ_DATABASE_URL).",
        )


class StepNotFound(NotFoundError):
    """No such workflow step; check the run id and step name."""

    def __init__(
        self,
        *,
        step_id: str | None = None,
        run_id: str | None = None,
        step_name: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.step_id = step_id
        self.run_id = run_id
        self.step_name = step_name
        if step_id is not None:
            where = f"step id {step_id!r}"
            hint = hint or "check the id (a Celery step's id is its task id)"
        else:
            where = f"step {step_name!r} of run {run_id!r}"
            hint = hint or f"`pikku-celery runs show {run_id}` lists the steps it has"
        super().__init__(f"Workflow {where} does not exist; {hint}.")


class VersionNotFound(NotFoundError):
    """No such workflow version; register it with store.versions.upsert_workflow_version()."""

    def __init__(self, workflow_name: str, graph_hash: str) -> None:
        self.workflow_name = workflow_name
        self.graph_hash = graph_hash
        super().__init__(
            f"Workflow {workflow_name!r} has no version {graph_hash!r}; register it with "
            "store.versions.upsert_workflow_version() first."
        )


class RunIdTaken(StoreError):
    """A start asked for a run id that a run of another workflow has."""

    def __init__(self, run_id: str, workflow: str, existing: str) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.existing = existing
        super().__init__(
            f"Run id {run_id!r} belongs to a run of workflow {existing!r}, not {workflow!r}; "
            "give this start another run_id (or idempotency_key): a key is unique across "
            "workflows."
        )


class RunSettled(StoreError):
    """An event was sent to a run that has ended."""

    def __init__(self, run_id: str, status: str) -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(
            f"Run {run_id!r} is {status}, so no wait of it can take an event any more; send "
            "it to a running or suspended run, or resume/rerun this one first."
        )


class InvalidStatus(StoreError, ValueError):
    """A status outside the allowed set was given."""

    def __init__(self, kind: str, status: object, allowed: frozenset[str]) -> None:
        self.status = status
        super().__init__(
            f"{status!r} is not a {kind} status; use one of {', '.join(sorted(allowed))}."
        )


class SchemaNotCurrent(StoreError):
    """The database schema is behind this version of pikku-celery; run `pikku-celery db upgrade`."""


class StoreUnavailable(StoreError, Transient):
    """The workflow database cannot be reached; check that it is running and the URL is right."""


class StoreConflict(StoreError, Transient):
    """The workflow database rolled the transaction back because it conflicted with another
    (a deadlock or a serialization failure); run it again."""


class WorkflowError(PikkuCeleryError):
    """A durable workflow could not go on."""


class StepFailed(WorkflowError):
    """A step of the workflow failed for good; catch it in the workflow to compensate."""

    def __init__(self, step_name: str, error: Mapping[str, Any] | None) -> None:
        self.step_name = step_name
        self.error = dict(error or {})
        detail = self.error.get("message") or "no message"
        kind = self.error.get("type")
        super().__init__(
            f"Step {step_name!r} failed for good ({kind + ': ' if kind else ''}{detail}); "
            "catch StepFailed in the workflow to compensate, or fix the cause and "
            "`pikku.resume(run_id)`."
        )


class EventTimeout(StepFailed):
    """``ctx.wait_for`` gave up: no event of its name came in time. Catch it to go on."""

    code = "EVENT_TIMEOUT"

    def __init__(self, step_name: str, event: str, timeout: float) -> None:
        self.event = event
        self.timeout = timeout
        super().__init__(
            step_name,
            {
                "type": "pikku_celery.EventTimeout",
                "code": self.code,
                "message": f"no {event!r} event came within {timeout:g}s",
                "event": event,
                "timeout": timeout,
            },
        )


class NotInAStep(WorkflowError):
    """``current_step()`` was called outside a mirrored step."""

    def __init__(self) -> None:
        super().__init__(
            "current_step() is only known inside a step: a @pikku.step task (or a "
            "WorkflowTask, or any task under mirror='all') while it runs, or an inline step "
            "of ctx.do; call it from there."
        )


class StepMismatch(WorkflowError):
    """A replay asked a recorded step for a different task than the one it ran."""

    def __init__(self, step_name: str, recorded: str | None, requested: str | None) -> None:
        self.step_name = step_name
        super().__init__(
            f"Step {step_name!r} was recorded with task {recorded!r} but this replay asks "
            f"for {requested!r}; give the new step another name, or start a new run."
        )


class VersionConflict(WorkflowError):
    """A run started by one version of a workflow was replayed by another that may not
    take it over."""

    code = "VERSION_CONFLICT"

    def __init__(
        self,
        workflow: str,
        started: str | None,
        current: str,
        *,
        run_id: str | None = None,
        step: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.workflow = workflow
        self.started = started
        self.current = current
        self.run_id = run_id
        #: The first step of the run's history this version does not replay as recorded;
        #: None when a pinned version (``version=``) refused the run without a look at them.
        self.step = step
        resume = f"`pikku.resume({run_id!r})`" if run_id else "`pikku.resume(run_id)`"
        if step is None:
            super().__init__(
                f"VERSION_CONFLICT: run of workflow {workflow!r} was started by version "
                f"{started!r} but this worker runs version {current!r}; finish it on a "
                f"worker of version {started!r} ({resume} once one runs), or declare that "
                f"version compatible: @pikku.workflow({workflow!r}, compatible=[{started!r}])."
            )
            return
        super().__init__(
            f"VERSION_CONFLICT: run of workflow {workflow!r} was started by version "
            f"{started!r}, and this worker's version {current!r} does not replay its steps: "
            f"step {step!r} {detail or 'is not replayed as recorded'}. Finish the run on a "
            f"worker of version {started!r} ({resume} once one runs), or start a new run: "
            "a new version takes a run over only when it asks for the run's recorded steps "
            "by the same names, in the same order."
        )


class NotAWorkflowRun(WorkflowError):
    """Only runs of durable workflows can be resumed or rerun."""

    def __init__(self, run_id: str, kind: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"Run {run_id!r} is a {kind} run, not a durable workflow, so pikku-celery cannot "
            "replay it; publish the task or canvas again, or write it as a @pikku.workflow "
            "to make it resumable."
        )


class RunFailed(WorkflowError):
    """The run failed; its error says which step and why."""

    def __init__(
        self, run_id: str, error: Mapping[str, Any] | None, kind: str = "workflow"
    ) -> None:
        self.run_id = run_id
        self.error = dict(error or {})
        #: What ran: "workflow" (a durable workflow), "canvas" (pikku.run) or "task".
        self.kind = kind
        if kind == "workflow":
            what_now = f"fix the cause and `pikku.resume({run_id!r})` it"
        else:
            # Only a durable workflow can go on where it failed; anything else is sent anew.
            again = "pikku.run(signature, name=...)" if kind == "canvas" else "task.delay(...)"
            what_now = (
                f"fix the cause and publish the {kind} again (`{again}`, a new run): a "
                f"{kind} cannot be resumed; write it as a @pikku.workflow to make it resumable"
            )
        super().__init__(
            f"Run {run_id!r} failed: {self.error.get('message') or 'no message'}; see "
            f"`pikku-celery runs show {run_id}` for each attempt, {what_now}."
        )


class RunCancelled(WorkflowError):
    """The run was cancelled."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"Run {run_id!r} was cancelled; start a new run to do the work.")


class WaitTimeout(WorkflowError, TimeoutError):
    """The run did not settle in time."""

    def __init__(self, run_id: str, timeout: float, status: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"Run {run_id!r} is still {status} after {timeout:g}s; wait longer, or check "
            "that a worker is running (`celery -A yourapp worker`)."
        )


class NeverIdle(WorkflowError):
    """The inline runner ran its limit of messages and more kept coming; look for a step
    that retries for ever or a workflow that never stops, or raise max_messages."""

    def __init__(self, ran: int, waiting: dict[str, int]) -> None:
        self.ran = ran
        self.waiting = dict(waiting)
        queued = ", ".join(f"{name}: {count}" for name, count in sorted(self.waiting.items()))
        super().__init__(
            f"The inline runner ran {ran} messages and still has more to run "
            f"({queued or 'none queued; the mirror still has events to write'}); look for a "
            "step that retries for ever or a workflow that never stops, or raise "
            "run_until_idle(max_messages=...)."
        )
