from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery, signals
from celery.utils.dispatch import Signal

from pikku_celery import PikkuCelery, WorkflowTask
from pikku_celery.errors import ConfigurationError
from pikku_celery.integration import signals as pikku_signals
from pikku_celery.integration.reaper import visibility_timeout


def receivers_of(signal: Signal) -> int:
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
    first.uninstall()  # replaced by the second: nothing to take off
    assert pikku_signals.registry[id(app)] is second
    second.uninstall()
    assert id(app) not in pikku_signals.registry


def test_step_is_a_real_celery_task_with_celery_retries(tmp_path: Path) -> None:
    app = Celery("steps", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'b.db'}")

    @pikku.step(retries=3, retry_delay=2, backoff=True, name="steps.charge")
    def charge(order_id: int) -> int:
        return order_id

    assert isinstance(charge, WorkflowTask)
    assert charge.name == "steps.charge"
    assert (charge.max_retries, charge.default_retry_delay) == (3, 2)
    # celery-types' Task stub lacks the autoretry options that Celery sets on the task class.
    assert charge.autoretry_for == (Exception,)  # type: ignore[attr-defined]
    assert charge.retry_backoff is True  # type: ignore[attr-defined]
    assert charge.step_name_for(charge.name) == "charge"
    assert charge(5) == 5  # still an ordinary callable

    @pikku.step(step_name="ship-it")
    def ship() -> None:
        return None

    assert ship.step_name_for(ship.name) == "ship-it"
    pikku.uninstall()


def test_reap_every_schedules_the_reaper_in_celery_beat(tmp_path: Path) -> None:
    app = Celery("beat", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"mine": {"task": "x", "schedule": 5.0}}
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'b.db'}")
    pikku.reap_every(30.0, idle_for=60)
    schedule = app.conf.beat_schedule
    assert schedule["mine"] == {"task": "x", "schedule": 5.0}  # the user's entries stay
    assert schedule["pikku_celery.reap"] == {
        "task": "pikku_celery.reap",
        "schedule": 30.0,
        "kwargs": {"idle_for": 60},
        "options": {"expires": 30.0},
    }
    assert "pikku_celery.reap" in app.tasks  # a worker of this app runs it


def test_the_journal_folder_is_per_database_and_configurable(tmp_path: Path) -> None:
    app = Celery("journal", broker="memory://", set_as_current=False)
    app.conf.pikku_journal_dir = str(tmp_path / "conf")
    one = PikkuCelery(app, f"sqlite:///{tmp_path / 'one.db'}")
    two = PikkuCelery(app, f"sqlite:///{tmp_path / 'two.db'}")
    assert one.mirror.journal_folder.parent == tmp_path / "conf"
    assert one.mirror.journal_folder != two.mirror.journal_folder
    three = PikkuCelery(app, f"sqlite:///{tmp_path / 'one.db'}", journal_dir=str(tmp_path / "arg"))
    assert three.mirror.journal_folder.parent == tmp_path / "arg"


def test_task_events_stay_the_users_choice(tmp_path: Path) -> None:
    app = Celery("events", broker="memory://", set_as_current=False)
    PikkuCelery(app, f"sqlite:///{tmp_path / 'e.db'}")
    assert not app.conf.worker_send_task_events
    assert not app.conf.task_send_sent_event
    chosen = Celery("chosen", broker="memory://", set_as_current=False)
    chosen.conf.worker_send_task_events = True
    PikkuCelery(chosen, f"sqlite:///{tmp_path / 'c.db'}")
    assert chosen.conf.worker_send_task_events and not chosen.conf.task_send_sent_event


def test_the_packages_own_tasks_take_their_arguments_through_apply_async(
    tmp_path: Path,
) -> None:
    # celery beat and `.delay()` check a task's arguments against its signature.
    app = Celery("own", broker="memory://", set_as_current=False)
    PikkuCelery(app, f"sqlite:///{tmp_path / 'c.db'}")
    app.tasks["pikku_celery.reap"].apply_async(kwargs={"idle_for": 0})
    app.tasks["pikku_celery.orchestrate"].apply_async(("run-id",))
    app.tasks["pikku_celery.wake"].apply_async(("run-id", "step-id", 1))


def test_a_step_takes_a_duration_string_and_refuses_a_delay_that_is_none(tmp_path: Path) -> None:
    import pytest

    from pikku_celery.errors import InvalidDuration

    app = Celery("delays", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'c.db'}")

    @pikku.step(retries=1, retry_delay="1500ms", name="delays.ship")
    def ship() -> None:
        return None

    # Celery counts seconds.
    assert ship.default_retry_delay == 1.5
    for bad in (-1, "1.5s", "exponential"):
        with pytest.raises(InvalidDuration, match="'200ms'"):
            pikku.step(retries=1, retry_delay=bad, name=f"delays.bad{bad}")
    pikku.uninstall()


def test_the_workers_reaper_runs_every_ten_seconds_unless_set_or_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = Celery("reaper-interval", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'r.db'}")
    try:
        assert pikku.reaper_interval == 10.0
        monkeypatch.setenv("PIKKU_REAPER_INTERVAL", "2.5")
        assert pikku.reaper_interval == 2.5
        app.conf.pikku_reaper_interval = 0
        assert pikku.reaper_interval == 0.0
        app.conf.pikku_reaper_interval = False
        assert pikku.reaper_interval == 0.0
        for bad in ("soon", -1):
            app.conf.pikku_reaper_interval = bad
            with pytest.raises(ConfigurationError, match="pikku_reaper_interval"):
                _ = pikku.reaper_interval
    finally:
        pikku.uninstall()


def test_the_broker_decides_whether_a_lost_workflow_step_is_dispatched_again() -> None:
    redis = Celery("vt", broker="redis://127.0.0.1:1/0", set_as_current=False)
    assert visibility_timeout(redis) == 3600.0
    redis.conf.broker_transport_options = {"visibility_timeout": 120}
    assert visibility_timeout(redis) == 120.0
    # RabbitMQ gives a dead consumer's messages back at once: nothing to wait for.
    amqp = Celery("amqp", broker="amqp://guest@127.0.0.1:1//", set_as_current=False)
    assert visibility_timeout(amqp) is None
