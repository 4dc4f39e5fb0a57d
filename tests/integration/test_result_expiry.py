"""Results expire by ``result_expires`` without beat: the workers' upkeep deletes them in
small steps, and Celery's ``backend_cleanup`` (for those who run beat) deletes them all."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.store import ResultWrite, now


@pytest.fixture
def pikku(store: WorkflowStore) -> Iterator[PikkuCelery]:
    app = Celery("expiry", broker="memory://", backend="pikku://", set_as_current=False)
    app.conf.result_expires = dt.timedelta(minutes=1)
    pikku = PikkuCelery(app, store=store)
    yield pikku
    pikku.uninstall()
    app.close()


def _results(store: WorkflowStore, age: dt.timedelta, count: int) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    store.results.write([ResultWrite(i, 1, "SUCCESS", b"x", now() - age) for i in ids])
    return ids


def test_the_workers_upkeep_expires_old_results_and_keeps_fresh_ones(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    old = _results(store, dt.timedelta(minutes=5), 3)
    fresh = _results(store, dt.timedelta(seconds=1), 2)
    upkeep = pikku.prepare_upkeep("expiry@host")
    upkeep.reap_once(at_start=True)
    assert set(store.results.get_many(old + fresh)) == set(fresh)


def test_backend_cleanup_deletes_every_expired_result(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    old = _results(store, dt.timedelta(hours=2), 2500)  # more than one batch
    fresh = _results(store, dt.timedelta(seconds=1), 1)
    pikku.app.backend.cleanup()
    assert set(store.results.get_many(old + fresh)) == set(fresh)


def test_results_are_kept_for_ever_when_result_expires_is_none(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    pikku.app.conf.result_expires = None
    old = _results(store, dt.timedelta(days=400), 2)
    pikku.app.backend.cleanup()
    pikku.prepare_upkeep("expiry@host").reap_once(at_start=True)
    assert set(store.results.get_many(old)) == set(old)


def test_results_expire_when_the_backend_is_named_by_another_alias(
    store: WorkflowStore,
) -> None:
    # Celery finds a backend by its loader's aliases too: the store is the backend (and
    # expires its results) whatever name the URL's scheme gives it.
    app = Celery("expiry-alias", broker="memory://", set_as_current=False)
    app.loader.override_backends = {"results": "pikku_celery.integration.backend:PikkuBackend"}
    database = store.engine.url.render_as_string(hide_password=False)
    app.conf.update(result_backend=f"results+{database}")
    app.conf.result_expires = dt.timedelta(minutes=1)
    pikku = PikkuCelery(app, store=store)
    try:
        old = _results(store, dt.timedelta(minutes=5), 2)
        pikku.prepare_upkeep("expiry@host").reap_once(at_start=True)
        assert type(app.backend).__name__ == "PikkuBackend"
        assert store.results.get_many(old) == {}
    finally:
        pikku.uninstall()
        app.close()
