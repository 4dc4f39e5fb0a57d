from __future__ import annotations

from pathlib import Path

from celery import Celery, signals

from pikku_celery import PikkuCelery, WorkflowTask
from pikku_celery.integration import signals as pikku_signals


def receivers_of(signal: signals.Signal) -> int:
    return sum(1 for key, _ in signal.receivers if str(key[0]).startswith("pikku_celery."))


def test_installing_twice_connects_each_handler_once(tmp_path: Path) -> None:
    app = Celery("twice", broker="memory://", set_as_current=False)
    first = PikkuCelery(app, f"sqlite:///{tmp_path / 'a.db'}")
    second = PikkuCelery(app, f"sqlite:///{tmp_path / 'a.db'}")
    for signal in (
        signals.before_task_publish,
        signals.task_prerun,
        signals.task_retry,
        signals.task_success,
        signals.task_failure,
        signals.task_revoked,
    ):
        assert receivers_of(signal) == 1, signal
    assert pikku_signals.registry[id(app)] is second
    assert first.app is second.app
    assert app.conf.worker_send_task_events is True
    assert app.conf.task_send_sent_event is True
    del pikku_signals.registry[id(app)]


def test_step_is_a_real_celery_task_with_celery_retries(tmp_path: Path) -> None:
    app = Celery("steps", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'b.db'}")

    @pikku.step(retries=3, retry_delay=2, backoff=True, name="steps.charge")
    def charge(order_id: int) -> int:
        return order_id

    assert isinstance(charge, WorkflowTask)
    assert charge.name == "steps.charge"
    assert (charge.max_retries, charge.default_retry_delay) == (3, 2)
    assert charge.autoretry_for == (Exception,)
    assert charge.retry_backoff is True
    assert charge.step_name_for(charge.name) == "charge"
    assert charge(5) == 5  # still an ordinary callable

    @pikku.step(step_name="ship-it")
    def ship() -> None:
        return None

    assert ship.step_name_for(ship.name) == "ship-it"
    del pikku_signals.registry[id(app)]
