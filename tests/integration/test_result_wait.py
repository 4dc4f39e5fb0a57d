"""``wait_for`` looks at a result's parents as Celery's Redis backend does: after every wait,
and at least once, so a chord's failed header task raises its own error however late the
body's ``ChordError`` and the caller's ``get()`` came."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from pikku_celery import PikkuCelery, WorkflowStore


@pytest.fixture
def pikku(store: WorkflowStore) -> Iterator[PikkuCelery]:
    app = Celery("wait", broker="memory://", backend="pikku://", set_as_current=False)
    pikku = PikkuCelery(app, store=store)
    yield pikku
    pikku.uninstall()
    app.close()


def test_a_result_ready_at_the_first_look_still_has_its_parents_looked_at(
    pikku: PikkuCelery,
) -> None:
    backend: Any = pikku.app.backend
    task_id = str(uuid.uuid4())
    backend.store_result(task_id, 3, "SUCCESS")  # in SQL when it returns
    looks: list[str] = []
    meta = backend.wait_for(task_id, timeout=5, on_interval=lambda: looks.append("parents"))
    assert meta["status"] == "SUCCESS" and meta["result"] == 3
    assert looks == ["parents"]


def test_a_parents_error_seen_at_the_look_wins_over_the_result(pikku: PikkuCelery) -> None:
    backend: Any = pikku.app.backend
    task_id = str(uuid.uuid4())
    backend.store_result(task_id, RuntimeError("the body's"), "FAILURE")

    def parent_failed() -> None:
        raise KeyError("the header task's own")

    with pytest.raises(KeyError, match="the header task's own"):
        backend.wait_for(task_id, timeout=5, on_interval=parent_failed)
