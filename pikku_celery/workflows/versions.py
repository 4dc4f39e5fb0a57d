"""A run started by another version of its workflow, replayed by this one under watch.

The run goes on when this version asks for the run's recorded steps as they were
recorded: the same names, the same tasks, each after the same step. It fails
with ``VERSION_CONFLICT``, naming the first step that differs, when it does not.
Before this version does anything the history does not hold (claims a new step,
runs a new inline step, ends the run), every recorded step must have been asked
for; a replay that cannot tell leaves the run suspended instead of failing it.

Steps a task step published (a mirrored task it sent, a ``Task.replace``) join the
run after that step, and no version of the workflow asks for them; they are told
apart from the workflow's own where the history allows it (see ``_Placing``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from pikku_celery.errors import VersionConflict
from pikku_celery.store import CHILD_RPC_PREFIX, SLEEP_RPC, WAIT_RPC, StepState

__all__ = ["Diverged", "Undecided", "VersionWatch"]


class Diverged(BaseException):
    """This version does not replay the run's history: the run fails with the conflict.

    A BaseException, as ``Suspend`` is, so that no ``except Exception`` in the
    workflow can swallow it and carry on down a path the run never took.
    """

    def __init__(self, conflict: VersionConflict) -> None:
        super().__init__(str(conflict))
        self.conflict = conflict


class Undecided(BaseException):
    """This replay cannot tell whether this version may take the run over."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Placing(Enum):
    OWN = "own"  # a step of the workflow's own: this version must ask for it
    PUBLISHED = "published"  # a task a step of the workflow sent: nobody asks for it
    UNKNOWN = "unknown"  # either, as far as the history says


def _plain_task(step: StepState) -> bool:
    """A step run by a Celery task: the only kind of step that can publish others."""
    name = step.rpc_name
    return (
        name is not None
        and name not in (SLEEP_RPC, WAIT_RPC)
        and not name.startswith(CHILD_RPC_PREFIX)
    )


def _after(name: str | None) -> str:
    return "first" if name is None else f"after {name!r}"


class VersionWatch:
    """Holds each step a replay asks for against the run's history."""

    def __init__(
        self,
        workflow: str,
        run_id: str,
        started: str | None,
        current: str,
        steps: Mapping[str, StepState],
    ) -> None:
        self.workflow = workflow
        self.run_id = run_id
        self.started = started
        self.current = current
        self._steps = steps
        self._asked: set[str] = set()
        self._clear = not steps  # every recorded step was asked for, as recorded

    def asked(self, key: str, rpc_name: str | None, previous: str | None) -> None:
        """The replay asks for step ``key`` of task ``rpc_name`` (None: inline) after
        ``previous``; a recorded step asked for otherwise than it was recorded diverges."""
        self._asked.add(key)
        step = self._steps.get(key)
        if step is None:
            return
        if step.rpc_name != rpc_name:
            raise self._diverged(
                key,
                f"was recorded {_kind(step.rpc_name)}, and this version asks for it "
                f"{_kind(rpc_name)}",
            )
        if step.from_step_name != previous:
            raise self._diverged(
                key,
                f"was recorded {_after(step.from_step_name)}, and this version asks for it "
                f"{_after(previous)}",
            )

    def beyond(self, doing: str) -> None:
        """Before the replay does what the history does not hold (``doing``: "asks for a
        new step 'x'", "ends the run"): every recorded step must have been asked for."""
        if self._clear:
            return
        undecided: StepState | None = None
        for step in self._unasked():
            placing = self._placing(step)
            if placing is _Placing.OWN:
                raise self._diverged(
                    step.step_name,
                    f"was recorded {_after(step.from_step_name)}, and this version {doing} "
                    "instead of asking for it",
                )
            if placing is _Placing.UNKNOWN and undecided is None:
                undecided = step
        if undecided is not None:
            raise Undecided(
                f"this version {doing} where the run's history holds step "
                f"{undecided.step_name!r} (recorded {_kind(undecided.rpc_name)}, "
                f"{_after(undecided.from_step_name)}), which may be the old version's next "
                "step or a task that step published"
            )
        self._clear = True

    def own_error(self, error: BaseException) -> None:
        """The workflow raised ``error`` of its own: it fails the run only when every
        recorded step was asked for first, else this version cannot be judged by it."""
        if self._clear:
            return
        unasked = [
            step.step_name
            for step in self._unasked()
            if self._placing(step) is not _Placing.PUBLISHED
        ]
        if not unasked:
            self._clear = True
            return
        raise Undecided(
            f"the workflow raised {type(error).__name__}: {error} before it asked for "
            f"the run's recorded steps {', '.join(map(repr, unasked))}"
        )

    def _unasked(self) -> list[StepState]:
        """Recorded steps not asked for that hang off what this replay walked: their own
        earlier steps were asked for (a step after an unasked one is judged by that one)."""
        return [
            step
            for step in self._steps.values()
            if step.step_name not in self._asked
            and (step.from_step_name is None or step.from_step_name in self._asked)
        ]

    def _placing(self, step: StepState) -> _Placing:
        previous = self._steps.get(step.from_step_name) if step.from_step_name else None
        # Only a task step publishes, and what it publishes are tasks: a step first in
        # the run, one that is not a task, or one after a step that is no task is the
        # workflow's own.
        if step.from_step_name is None or not _plain_task(step):
            return _Placing.OWN
        if previous is None:
            return _Placing.UNKNOWN  # after a step the history does not hold
        if not _plain_task(previous):
            return _Placing.OWN
        # The workflow's own next step after that task is one this replay asked for, so
        # this one is what the task published (or a branch of a parallel group dropped).
        if any(
            other.step_name in self._asked and other.from_step_name == previous.step_name
            for other in self._steps.values()
        ):
            return _Placing.PUBLISHED
        return _Placing.UNKNOWN

    def _diverged(self, step: str, detail: str) -> Diverged:
        return Diverged(
            VersionConflict(
                self.workflow,
                self.started,
                self.current,
                run_id=self.run_id,
                step=step,
                detail=detail,
            )
        )


def _kind(rpc_name: str | None) -> str:
    if rpc_name is None:
        return "inline"
    if rpc_name == SLEEP_RPC:
        return "as a sleep"
    if rpc_name == WAIT_RPC:
        return "as a wait for an event"
    if rpc_name.startswith(CHILD_RPC_PREFIX):
        return f"as child workflow {rpc_name[len(CHILD_RPC_PREFIX) :]!r}"
    return f"as task {rpc_name!r}"
