"""A run with a chord completes with its body: a task (awaited by its id) or a group (whose
frozen id no step has). Real mirror and Celery worker code through the inline runner, on
SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery import Celery, chord, group

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.testing import InlineRunner

NOWHERE = "redis://127.0.0.1:9/0"  # nothing listens: a message that leaked would fail


@pytest.fixture
def runner(store: WorkflowStore) -> Iterator[tuple[PikkuCelery, InlineRunner]]:
    app = Celery(f"chords_{uuid.uuid4().hex[:8]}", broker=NOWHERE, set_as_current=False)
    pikku = PikkuCelery(app, store=store)
    url = store.engine.url.render_as_string(hide_password=False)
    try:
        with InlineRunner(pikku, database_url=url) as inline:
            yield pikku, inline
    finally:
        pikku.uninstall()
        app.close()


@pytest.mark.parametrize("body", ["task", "group"])
def test_a_run_with_a_chord_completes_once_its_body_is_done(
    runner: tuple[PikkuCelery, InlineRunner], store: WorkflowStore, body: str
) -> None:
    pikku, inline = runner

    @pikku.step(shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @pikku.step(shared=False)
    def total(values: list[int]) -> int:
        return sum(values)

    bodies = {
        "task": total.s(),
        "group": group(total.s(), total.s()),
    }
    run = inline.run(chord([add.s(1, 1), add.s(2, 2)], bodies[body]), name="chords")
    assert run.status == "completed", (body, run.status)
    names = {s.step_name: s.status for s in store.list_step_states(run.run_id)}
    assert set(names.values()) == {"succeeded"}
    assert "total" in names
