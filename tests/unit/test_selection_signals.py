"""The signal handlers follow the app's selection: what reaches the mirror under "all"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from pikku_celery import PikkuCelery
from pikku_celery.integration import headers as h
from pikku_celery.integration import signals as pikku_signals


class Recorder:
    """Stands in for the mirror's journal: which calls a handler made."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __call__(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, args[0] if args else kwargs))

        return record

    @property
    def kinds(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def pikku(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PikkuCelery]:
    app = Celery("everything", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'p.db'}", mirror="all", exclude=["e.noisy"])

    @app.task(name="e.plain", shared=False)
    def plain(x: int) -> int:
        return x + 1

    @app.task(name="e.noisy", shared=False)
    def noisy() -> None:
        return None

    recorder = Recorder()
    for method in ("published", "adoption", "started", "succeeded", "ended", "retried"):
        monkeypatch.setattr(pikku.mirror, method, recorder(method))
    pikku.recorder = recorder  # type: ignore[attr-defined]
    yield pikku
    pikku.uninstall()


def publish(sender: str, **headers: Any) -> dict[str, Any]:
    message = {"id": f"{sender}-id", **headers}
    pikku_signals.before_task_publish(
        sender=sender, headers=message, properties={}, body=((1,), {}, {})
    )
    return message


def test_a_plain_task_is_published_as_a_step_of_its_own_run(pikku: Any) -> None:
    message = publish("e.plain")
    [(kind, step)] = pikku.recorder.calls
    assert kind == "published"
    assert (step.run_id, step.step_name, step.rpc_name) == ("e.plain-id", "plain", "e.plain")
    assert step.new_run is not None and step.new_run.wire == {"type": "task"}
    assert (message[h.RUN_ID], message[h.STEP_NAME]) == ("e.plain-id", "plain")


def test_excluded_and_plumbing_tasks_publish_nothing(pikku: Any) -> None:
    for sender in ("e.noisy", "celery.chord_unlock", "pikku_celery.reap"):
        assert h.RUN_ID not in publish(sender)
    assert pikku.recorder.calls == []


def test_a_chord_unlock_in_a_run_passes_the_run_on_to_the_chord_body(pikku: Any) -> None:
    token = pikku_signals.current_run.set(pikku_signals.RunContext("run-1", "header-step"))
    try:
        message = publish("celery.chord_unlock")
    finally:
        pikku_signals.current_run.reset(token)
    assert (message[h.RUN_ID], message[h.PARENT_STEP]) == ("run-1", "header-step")
    assert h.STEP_NAME not in message  # a helper, not a step: its children follow its parent
    assert pikku.recorder.calls == []


def test_a_plain_task_run_in_process_is_started_and_succeeded(pikku: Any) -> None:
    assert pikku.app.tasks["e.plain"].apply((1,)).get() == 2
    assert pikku.recorder.kinds == ["adoption", "started", "succeeded"]


def test_an_excluded_task_run_in_process_reaches_no_handler(pikku: Any) -> None:
    pikku.app.tasks["e.noisy"].apply()
    assert pikku.recorder.calls == []
