"""``current_step()``: which run, step and attempt the running code belongs to.

The idempotency key is derived as Pikku derives a step's ``invocationId`` (a
UUIDv5 of ``run_id + ":" + step_name`` in Pikku's namespace), so both systems
give a step the same key: the same on every attempt and every replay of that
step, different for every other step.
"""

from __future__ import annotations

import contextvars
import uuid
from dataclasses import dataclass
from typing import Any, Final

from celery import current_task

from pikku_celery.errors import NotInAStep
from pikku_celery.integration import headers as h
from pikku_celery.integration.signals import mirror_of

__all__ = ["PIKKU_NAMESPACE", "StepInfo", "current_step", "idempotency_key", "inline_step"]

#: Pikku's frozen namespace for step invocation ids.
PIKKU_NAMESPACE: Final = uuid.UUID("70696b6b-7500-5770-9f6c-6f77000a0001")


def idempotency_key(run_id: str, step_name: str) -> str:
    """The step's stable key for calling outside services (a payment API's idempotency key)."""
    return str(uuid.uuid5(PIKKU_NAMESPACE, f"{run_id}:{step_name}"))


@dataclass(frozen=True, slots=True)
class StepInfo:
    """The step the running code is: its run, its name in the run, and which attempt."""

    run_id: str
    step_id: str
    step_name: str
    attempt: int

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.run_id, self.step_name)


#: Set by a workflow's replay while it runs an inline step (a plain callable).
inline_step: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "pikku_celery_inline_step", default=None
)


def current_step() -> StepInfo:
    """The step being run now, inside a mirrored task or an inline step of ``ctx.do``.

    Raises :class:`~pikku_celery.errors.NotInAStep` anywhere else. A step of a
    canvas is named as its message says (``charge``), before the mirror gives
    a repeat its ``#N``: give repeated canvas steps names of their own
    (``sig.set(pikku_step="charge-eu")``) when each needs its own key.
    """
    inline = inline_step.get()
    if inline is not None:
        return inline
    task: Any = current_task._get_current_object() if current_task else None  # type: ignore[attr-defined]
    request = getattr(task, "request", None)
    step_id = getattr(request, "id", None)
    if task is None or step_id is None or getattr(request, "called_directly", False):
        raise NotInAStep
    mirrored = mirror_of(task)  # the app's selection: a step, or a task left alone
    if mirrored is None:
        raise NotInAStep
    name = h.from_request(request, h.STEP_NAME) or mirrored.step_name
    return StepInfo(
        run_id=str(h.from_request(request, h.RUN_ID) or step_id),
        step_id=str(step_id),
        step_name=str(name),
        attempt=int(getattr(request, "retries", 0) or 0) + 1,
    )
