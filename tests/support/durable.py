"""A durable workflow's runs made by the real engine on the real store, for the faces' tests.

A dispatcher records the replays a run asks for instead of publishing them,
and ``settle`` plays the worker, as the integration tests of waits and child
runs do; what the CLI and the dashboard then show is what the engine wrote.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery import Celery

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.workflows.replay import replay

__all__ = ["Recorder", "ShippedOrder", "durable_pikku", "settle", "shipped_order"]


class Recorder:
    """Stands in for the broker: remembers every step, wake-up and replay a replay sent."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str, int]] = []
        self.wakes: list[tuple[str, int]] = []
        self.replays: list[tuple[str, dt.datetime | None]] = []
        self.lock = threading.Lock()

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
        with self.lock:
            self.steps.append((step_id, step_name, attempt))

    def wake(self, run_id: str, step_id: str, attempt: int, at: dt.datetime) -> None:
        with self.lock:
            self.wakes.append((step_id, attempt))

    def orchestrate(self, run_id: str, at: dt.datetime | None = None) -> None:
        with self.lock:
            self.replays.append((run_id, at))


@contextmanager
def durable_pikku(store: WorkflowStore) -> Iterator[PikkuCelery]:
    """A PikkuCelery on ``store`` whose replays are recorded, not published."""
    app = Celery("faces", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, store=store)
    pikku.workflows.dispatcher = Recorder()
    try:
        yield pikku
    finally:
        pikku.uninstall()
        app.close()


def settle(pikku: PikkuCelery) -> list[str]:
    """Replay every run asked for until none is (a wait's later deadline is left)."""
    dispatcher = pikku.workflows.dispatcher
    assert isinstance(dispatcher, Recorder)
    outcomes: list[str] = []
    now = dt.datetime.now(dt.timezone.utc)
    for _ in range(200):
        due = [i for i, (_, at) in enumerate(dispatcher.replays) if at is None or at <= now]
        if not due:
            return outcomes
        run_id, _ = dispatcher.replays.pop(due[0])
        run = pikku.store.get_run(run_id)
        workflow = pikku.workflows.workflows[run.workflow]
        outcomes.append(replay(pikku.store, workflow, run_id, dispatcher, run))
    raise AssertionError("the replays never settled")


@dataclass(frozen=True)
class ShippedOrder:
    parent: str  # "order": "size" decided branch "big", then "ship" is the child run
    child: str  # "ship": its wait "label" took an event, its wait "carrier" waits
    ship_step: str  # the parent's step that started the child
    label_step: str  # the child's wait that took the "label" event


def shipped_order(
    pikku: PikkuCelery,
    *,
    event: str = "label",
    data: Any = None,
    note: Any = "call before noon",
) -> ShippedOrder:
    """A parent run waiting for its child, the child waiting for an event.

    The child took one ``event`` (with ``data``) and keeps one "note" (with
    ``note``) nobody waits for; its "carrier" wait has an hour's deadline.
    """

    @pikku.workflow("ship")
    def ship(ctx: Any, order_id: int) -> Any:
        label = ctx.wait_for(event)
        return {"label": label, "carrier": ctx.wait_for("carrier", timeout=3600)}

    @pikku.workflow("order")
    def order(ctx: Any, order_id: int) -> Any:
        size = ctx.do("size", lambda: "big")
        ctx.branch(size)
        return ctx.do("ship", ship, order_id)

    store = pikku.store
    parent = order.start(order_id=7)
    settle(pikku)
    ship_step = store.get_step_state(parent, "ship")
    child = ship_step.child_run_id
    assert child is not None
    pikku.send(child, event, {"label": "L-7"} if data is None else data)
    pikku.send(child, "note", note)
    settle(pikku)
    label = store.get_step_state(child, event)
    assert label.status == "succeeded"
    assert store.get_step_state(child, "carrier").status == "scheduled"
    return ShippedOrder(
        parent=parent, child=child, ship_step=ship_step.step_id, label_step=label.step_id
    )
