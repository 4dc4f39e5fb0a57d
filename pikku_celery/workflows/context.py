"""``WorkflowContext`` (``ctx``): how a workflow function asks for its steps.

During a replay every step the run already has is answered from the store;
the first step it does not have is claimed, dispatched, and the replay stops
(:class:`Suspend`). The function therefore runs many times, and each finished
step's work is done once.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any, Protocol

from pikku_celery.errors import (
    ConfigurationError,
    EventTimeout,
    SerializationError,
    StepFailed,
    StepMismatch,
)
from pikku_celery.faults import crash_point
from pikku_celery.integration.step_info import StepInfo, idempotency_key, inline_step
from pikku_celery.integration.task import WorkflowTask, retry_policy
from pikku_celery.store import (
    CHILD_RPC_PREFIX,
    SLEEP_RPC,
    WAIT_RPC,
    StepState,
    WorkflowStore,
    error_document,
)
from pikku_celery.workflows.definition import Workflow
from pikku_celery.workflows.inputs import passed_in
from pikku_celery.workflows.reopen import reopen
from pikku_celery.workflows.versions import VersionWatch

__all__ = ["SLEEP", "WAIT", "Dispatcher", "RunState", "Suspend", "WorkflowContext"]

#: The task names recorded for a durable sleep and for a wait for an event.
SLEEP = SLEEP_RPC
WAIT = WAIT_RPC
_IN_FLIGHT = object()


def _system_clock() -> dt.datetime:
    """The time now, in UTC."""
    return dt.datetime.now(dt.timezone.utc)


#: Where a replay reads the time it sets and checks deadlines and wake times by. A hook,
#: so that the inline test runner can put its own clock here while it is open.
clock: Callable[[], dt.datetime] = _system_clock


class Suspend(BaseException):
    """The replay stops: a step is in flight. Workflow code must not catch it."""


class Dispatcher(Protocol):
    """Sends the messages a replay decides on (Celery in production)."""

    def step(
        self,
        run_id: str,
        step_id: str,
        step_name: str,
        task: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        attempt: int,
    ) -> None: ...

    def wake(self, run_id: str, step_id: str, attempt: int, at: dt.datetime) -> None: ...

    def orchestrate(self, run_id: str, at: dt.datetime | None = None) -> None: ...


class RunState(MutableMapping[str, Any]):
    """``ctx.state``: the run's JSON key/value state; each write is one atomic statement."""

    def __init__(self, store: WorkflowStore, run_id: str, values: dict[str, Any]) -> None:
        self._store = store
        self._run_id = run_id
        self._values = values

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __setitem__(self, key: str, value: Any) -> None:
        old = self._values.get(key, _IN_FLIGHT)
        if type(old) is type(value) and old == value:
            return  # a replay setting what it set before: no write
        self._store.update_run_state(self._run_id, key, value)
        self._values[key] = value

    def __delitem__(self, key: str) -> None:
        raise TypeError("Run state keys cannot be deleted; set the key to None instead.")

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _is_task(fn: Any) -> bool:
    return hasattr(fn, "apply_async") and hasattr(fn, "name")


def _is_placeholder(value: Any) -> bool:
    """What the mirror stores for a task's result that is not JSON
    (``mirror.values.unserialisable``): a note of what it was, never the value."""
    return isinstance(value, dict) and value.get("__pikku_unserialisable__") is True


def _not_json(run_id: str, key: str, placeholder: dict[str, Any]) -> SerializationError:
    """The error an inline step's result that is not JSON raises, for a task's: the value
    itself is gone, so the workflow must never go on with the note in its place."""
    return SerializationError(
        f"The result of step {key!r} cannot be stored as JSON (its task returned "
        f"{placeholder.get('repr')}, of type {placeholder.get('type')}); return JSON types "
        "(dict, list, str, int, float, bool, None) or convert the value first, then "
        f"`pikku.rerun({run_id!r}, from_step={key!r})`: the step counts as done, so a "
        "resume would not run it again."
    )


def _rpc_name(fn: Any) -> str | None:
    """The task name a step of ``fn`` is recorded under (None: an inline step)."""
    if isinstance(fn, Workflow):
        return CHILD_RPC_PREFIX + fn.name
    if _is_task(fn):
        return str(fn.name)
    return None


class WorkflowContext:
    def __init__(
        self,
        store: WorkflowStore,
        run_id: str,
        steps: dict[str, StepState],
        state: dict[str, Any],
        dispatcher: Dispatcher,
        watch: VersionWatch | None = None,
    ) -> None:
        """``watch``: set when the run was started by another version of the workflow."""
        self.run_id = run_id
        self.state = RunState(store, run_id, state)
        self.sleeping = False
        self._store = store
        self._steps = steps
        self._dispatcher = dispatcher
        self._seen: dict[str, int] = {}
        self._previous: str | None = None
        self._previous_id: str | None = None
        self.watch = watch

    # --- the workflow's API -----------------------------------------------------

    def do(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` as the step ``name`` once; later replays get its stored result.

        ``fn`` is a Celery task of pikku's (``@pikku.step``): it is dispatched to a
        worker. Any other callable is an inline step, run here in the replay.
        """
        key = self._key(name)
        self._asking(key, _rpc_name(fn), self._previous)
        value = self._resolve(key, fn, args, kwargs, self._previous)
        self._previous = key
        if value is _IN_FLIGHT:
            raise Suspend
        return value

    def wait_for(self, name: str, *, timeout: float | None = None) -> Any:
        """Suspend the run until an event ``name`` is sent to it; returns the event's data.

        ``pikku.send(run_id, name, data)`` (or ``pikku-celery runs send``, or the
        dashboard) sends one. An event sent before the run gets here is kept and
        taken now; each event is taken by one wait, oldest first. After
        ``timeout`` seconds with no event, :class:`EventTimeout` is raised here
        (catch it to go on); the deadline is durable, like ``ctx.sleep``.
        """
        if timeout is not None and timeout < 0:
            raise ConfigurationError(f"wait_for({name!r}) needs a timeout of 0 or more seconds.")
        key = self._key(name)
        step = self._steps.get(key)
        self._asking(key, WAIT, self._previous)
        previous, self._previous = self._previous, key
        now = clock()
        if step is None:
            self._beyond(f"waits for a new event {key!r}")
            deadline = None if timeout is None else now + dt.timedelta(seconds=timeout)
            step_id = str(uuid.uuid4())
            data: dict[str, Any] = {
                "event": name,
                "timeout": timeout,
                "deadline": None if deadline is None else deadline.isoformat(),
            }
            if self._store.claims.claim_step(
                self.run_id, step_id, key, WAIT, data, from_step_name=previous
            ):
                if deadline is not None:
                    self._dispatcher.orchestrate(self.run_id, at=deadline)
            else:  # a concurrent replay claimed the wait first: its step and deadline count
                won = self._store.get_step_state(self.run_id, key)
                step_id, data = won.step_id, dict(won.data or {})
            attempt = 1
        else:
            self._check_task(key, step, WAIT)
            step_id, attempt, data = step.step_id, step.attempt_count, dict(step.data or {})
            if step.status == "succeeded":
                self._previous_id = step_id
                return step.result
            if step.status in ("failed", "cancelled"):
                raise self._wait_failed(key, step)
            if step.status == "pending":  # made pending again by a resume or rerun: wait anew
                deadline = None if timeout is None else now + dt.timedelta(seconds=timeout)
                data["deadline"] = None if deadline is None else deadline.isoformat()
                if (
                    self._store.workflows.restart_wait(step_id, attempt, data)
                    and deadline is not None
                ):
                    self._dispatcher.orchestrate(self.run_id, at=deadline)
                else:  # another replay restarted it: its deadline counts
                    data = dict(self._store.get_step(step_id).data or {})
        self._previous_id = step_id
        taken, value = self._store.workflows.take_event(self.run_id, step_id, attempt, name)
        if taken:
            return value
        deadline_text = data.get("deadline")
        if isinstance(deadline_text, str) and now >= dt.datetime.fromisoformat(deadline_text):
            timed_out = EventTimeout(key, name, float(data.get("timeout") or 0))
            if self._store.workflows.time_out_wait(step_id, attempt, timed_out.error):
                raise timed_out
            won = self._store.get_step(step_id)  # an event came first: it stands
            if won.status == "succeeded":
                return won.result
        if isinstance(deadline_text, str) and step is not None and step.status != "pending":
            # The replay at the deadline may have been lost with a worker; another one
            # costs nothing (a replay is idempotent), so every replay of a waiting run
            # sends one, as a sleep does with its wake-up.
            self._dispatcher.orchestrate(self.run_id, at=dt.datetime.fromisoformat(deadline_text))
        self.sleeping = True
        raise Suspend

    def branch(self, key: str) -> str:
        """Record ``key`` as the branch the workflow takes after its last step; returns it.

        Shown with that step in ``runs show`` and the dashboard (``branch_taken``).
        """
        if not isinstance(key, str) or not key:
            raise ConfigurationError("ctx.branch(key) takes the branch's name, a non-empty str.")
        if self._previous_id is None:
            raise ConfigurationError(
                f"ctx.branch({key!r}) names the branch taken after a step; call it after "
                "the ctx.do(...) whose result decides it."
            )
        recorded = next(
            (s.branch_taken for s in self._steps.values() if s.step_id == self._previous_id),
            None,
        )
        if recorded != key:  # a replay taking the branch it took before: no write
            self._store.workflows.set_branch_taken(self._previous_id, key)
        return key

    def do_all(self, calls: Sequence[Sequence[Any]]) -> list[Any]:
        """Steps in parallel: ``[(name, fn, *args), ...]``; returns their results in order.

        All are dispatched at once. When one failed for good, ``StepFailed``
        is raised once every branch has ended.
        """
        before = self._previous
        results: list[Any] = []
        failure: StepFailed | None = None
        keys = [self._key(name) for name, *_ in calls]
        # Every branch is asked for before any is claimed, so that a new branch beside
        # recorded ones is judged with the whole group, wherever it stands in it.
        for key, (_, fn, *_) in zip(keys, calls, strict=True):
            self._asking(key, _rpc_name(fn), before)
        for key, (_, fn, *args) in zip(keys, calls, strict=True):
            try:
                results.append(self._resolve(key, fn, tuple(args), {}, before))
            except StepFailed as exc:
                failure = failure or exc
                results.append(None)
            self._previous = key
        if any(value is _IN_FLIGHT for value in results):
            raise Suspend
        if failure is not None:
            raise failure
        return results

    def sleep(self, name: str, *, seconds: float) -> None:
        """A durable pause: a message with an ETA wakes the run, whatever restarts between."""
        key = self._key(name)
        step = self._steps.get(key)
        self._asking(key, SLEEP, self._previous)
        previous, self._previous = self._previous, key
        now = clock()
        if step is None:
            self._beyond(f"sleeps in a new step {key!r}")
            wake_at = now + dt.timedelta(seconds=seconds)
            step_id = str(uuid.uuid4())
            self._previous_id = step_id
            if self._store.claims.claim_step(
                self.run_id,
                step_id,
                key,
                SLEEP,
                {"seconds": seconds, "wake_at": wake_at.isoformat()},
                eta=wake_at,
                from_step_name=previous,
            ):
                self._dispatcher.wake(self.run_id, step_id, 1, wake_at)
            self.sleeping = True
            raise Suspend
        self._previous_id = step.step_id
        self._check_task(key, step, SLEEP)
        if step.status == "succeeded":
            return
        if step.status == "pending":  # made pending again by a rerun: sleep anew
            wake_at = now + dt.timedelta(seconds=seconds)
            if self._store.claims.take_pending_step(step.step_id, step.attempt_count, eta=wake_at):
                self._dispatcher.wake(self.run_id, step.step_id, step.attempt_count, wake_at)
            self.sleeping = True
            raise Suspend
        wake_at = dt.datetime.fromisoformat((step.data or {}).get("wake_at", now.isoformat()))
        if now >= wake_at:
            # Past its time: whichever comes first, this replay or the wake-up message.
            self._store.attempts.record_attempt(
                step.step_id, step.attempt_count, "succeeded", run_id=step.run_id
            )
            return
        # The wake-up may have been lost with a worker; another one costs nothing
        # (waking is idempotent), so every replay of a sleeping run sends one.
        self._dispatcher.wake(self.run_id, step.step_id, step.attempt_count, wake_at)
        self.sleeping = True
        raise Suspend

    # --- replay ------------------------------------------------------------------

    def _key(self, name: str) -> str:
        count = self._seen.get(name, 0) + 1
        self._seen[name] = count
        return name if count == 1 else f"{name}#{count}"

    def _asking(self, key: str, rpc_name: str | None, previous: str | None) -> None:
        if self.watch is not None:
            self.watch.asked(key, rpc_name, previous)

    def _beyond(self, doing: str) -> None:
        """Before a step the run's history does not hold is claimed or run."""
        if self.watch is not None:
            self.watch.beyond(doing)

    @staticmethod
    def _check_task(key: str, step: StepState, expected: str | None) -> None:
        if step.rpc_name != expected:
            raise StepMismatch(key, step.rpc_name, expected)

    def _ended(self, key: str, step: StepState, rpc_name: str | None) -> Any:
        """A recorded step's stored result, ``StepFailed`` if it failed for good, or
        ``_IN_FLIGHT`` while it has not ended."""
        self._previous_id = step.step_id
        self._check_task(key, step, rpc_name)
        if step.status == "succeeded":
            if _is_placeholder(step.result):
                raise _not_json(self.run_id, key, step.result)
            return step.result
        if step.status in ("failed", "cancelled"):
            raise StepFailed(key, step.error)
        return _IN_FLIGHT

    @staticmethod
    def _wait_failed(key: str, step: StepState) -> StepFailed:
        error = dict(step.error or {})
        if error.get("code") == EventTimeout.code:
            return EventTimeout(key, str(error.get("event")), float(error.get("timeout") or 0))
        return StepFailed(key, error)

    def _resolve(
        self,
        key: str,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        previous: str | None,
    ) -> Any:
        if isinstance(fn, Workflow):
            return self._child_step(key, fn, args, kwargs, previous)
        if _is_task(fn):
            return self._task_step(key, fn, args, kwargs, previous)
        if callable(fn):
            return self._inline_step(key, fn, args, kwargs, previous)
        raise ConfigurationError(
            f"Step {key!r} needs a task or a callable, not {type(fn).__name__}."
        )

    def _task_step(
        self,
        key: str,
        task: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        previous: str | None,
    ) -> Any:
        if not isinstance(task, WorkflowTask):
            raise ConfigurationError(
                f"Task {task.name!r} is not a pikku step, so its outcome would never reach "
                "the run; decorate it with @pikku.step or use base=WorkflowTask."
            )
        step = self._steps.get(key)
        if step is None:
            self._beyond(f"asks for a new step {key!r}")
            step_id = str(uuid.uuid4())
            self._previous_id = step_id
            policy = retry_policy(task)
            with passed_in(f"input of step {key!r}"):
                claimed = self._store.claims.claim_step(
                    self.run_id,
                    step_id,
                    key,
                    task.name,
                    {"args": list(args), "kwargs": kwargs},
                    from_step_name=previous,
                    retries=policy[0],
                    retry_delay=policy[1],
                )
            if claimed:
                # Claimed and not yet sent: a replay that dies here leaves the step
                # for the reaper, which sends it once its dispatch is overdue.
                crash_point("after_claim", key)
                self._dispatcher.step(self.run_id, step_id, key, task, args, kwargs, 1)
            return _IN_FLIGHT
        ended = self._ended(key, step, task.name)
        if ended is not _IN_FLIGHT:
            return ended
        if step.status == "pending" and self._store.claims.take_pending_step(
            step.step_id, step.attempt_count
        ):
            self._dispatcher.step(
                self.run_id, step.step_id, key, task, args, kwargs, step.attempt_count
            )
        return _IN_FLIGHT

    def _inline_step(
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        previous: str | None,
    ) -> Any:
        step = self._steps.get(key)
        if step is not None:
            ended = self._ended(key, step, None)
            if ended is not _IN_FLIGHT:
                return ended
        else:
            self._beyond(f"runs a new inline step {key!r}")
        step_id = step.step_id if step is not None else str(uuid.uuid4())
        attempt = step.attempt_count if step is not None else 1
        started = dt.datetime.now(dt.timezone.utc)
        error: dict[str, Any] | None = None
        value: Any = None
        token = inline_step.set(StepInfo(self.run_id, step_id, key, attempt))
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            error = error_document(exc)
        finally:
            inline_step.reset(token)
        status = "failed" if error else "succeeded"
        if step is None:
            claimed = self._store.claims.claim_step(
                self.run_id,
                step_id,
                key,
                None,
                None,
                status=status,
                from_step_name=previous,
                result=value,
                error=error,
                started_at=started,
            )
            if not claimed:  # a concurrent replay recorded it first: its outcome stands
                won = self._store.get_step_state(self.run_id, key)
                self._previous_id = won.step_id
                if won.status == "failed":
                    raise StepFailed(key, won.error)
                return won.result
            self._previous_id = step_id
        else:  # pending again after a resume or rerun: a new attempt of the same step
            self._store.attempts.record_attempt(
                step.step_id,
                step.attempt_count,
                status,
                result=value,
                error=error,
                run_id=step.run_id,
            )
        if error is not None:
            raise StepFailed(key, error)
        return value

    def _child_step(
        self,
        key: str,
        child: Workflow,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        previous: str | None,
    ) -> Any:
        """A child workflow: its own run, started once; the step ends as the child ends."""
        rpc_name = CHILD_RPC_PREFIX + child.name
        # Derived from the parent and the step, so no replay can make a second child.
        child_run_id = idempotency_key(self.run_id, key)
        step = self._steps.get(key)
        if step is None:
            self._beyond(f"starts a new child run {key!r}")
            step_id = str(uuid.uuid4())
            self._previous_id = step_id
            self._store.versions.upsert_workflow_version(
                child.name, child.version, child.graph, "python"
            )
            with passed_in(f"input of step {key!r}"):
                started = self._store.workflows.start_child(
                    self.run_id,
                    step_id,
                    key,
                    rpc_name,
                    {"args": list(args), "kwargs": kwargs},
                    child_run_id=child_run_id,
                    child_workflow=child.name,
                    graph_hash=child.version,
                    from_step_name=previous,
                )
            if started:
                self._dispatcher.orchestrate(child_run_id)
            return _IN_FLIGHT
        ended = self._ended(key, step, rpc_name)
        if ended is not _IN_FLIGHT:
            return ended
        if step.status == "pending" and self._store.claims.take_pending_step(
            step.step_id, step.attempt_count
        ):
            # The parent was resumed or rerun: its child goes on from where it ended.
            child_id = step.child_run_id or child_run_id
            reopen(self._store, child_id, rerun_completed=True)
            self._store.attempts.record_attempt(
                step.step_id, step.attempt_count, "running", task_id=child_id, run_id=step.run_id
            )
            self._dispatcher.orchestrate(child_id)
        return _IN_FLIGHT
