"""``pikku_result_wakeups``: ``database`` by default, ``broker`` only on a Redis broker, and
anything else a clear error naming the choices."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.errors import ConfigurationError
from pikku_celery.integration.wakeups import BrokerWakeups, configure_wakeups


@pytest.fixture
def store(tmp_path: Path) -> Iterator[WorkflowStore]:
    made = WorkflowStore(f"sqlite:///{tmp_path / 'p.db'}")
    yield made
    made.close()


def test_a_redis_broker_carries_them_when_asked(store: WorkflowStore) -> None:
    configure_wakeups(
        {"pikku_result_wakeups": "broker", "broker_url": "redis://:pw@127.0.0.1:6399/2"}, store
    )
    watch_owner = store.results._wakeups
    assert isinstance(watch_owner, BrokerWakeups)
    assert watch_owner.url == "redis://:pw@127.0.0.1:6399/2"


def test_the_variable_asks_when_the_app_does_not(
    store: WorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIKKU_RESULT_WAKEUPS", "broker")
    configure_wakeups({"broker_url": "redis://127.0.0.1:6399/0"}, store)
    assert isinstance(store.results._wakeups, BrokerWakeups)


def test_by_default_the_database_tells_readers(store: WorkflowStore) -> None:
    configure_wakeups({"broker_url": "redis://127.0.0.1:6399/0"}, store)
    assert store.results._wakeups is None


def test_a_broker_that_is_not_redis_is_refused_with_what_to_do(store: WorkflowStore) -> None:
    with pytest.raises(ConfigurationError) as refused:
        configure_wakeups(
            {"pikku_result_wakeups": "broker", "broker_url": "amqp://guest:secret@mq//"}, store
        )
    message = str(refused.value)
    assert "redis://" in message and "'database'" in message and "secret" not in message


def test_an_unknown_choice_names_the_choices(store: WorkflowStore) -> None:
    with pytest.raises(ConfigurationError, match=r"'database'.*'broker'.*not 'redis'"):
        configure_wakeups({"pikku_result_wakeups": "redis"}, store)
