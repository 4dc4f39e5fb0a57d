"""Lost and long-unstarted steps: a warning on the runs page, two gauges in ``/metrics``."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.dashboard import create_app
from pikku_celery.errors import ConfigurationError
from pikku_celery.schema import workflow_step
from tests.dashboard.conftest import Seeded, lost_run
from tests.dashboard.test_metrics import samples
from tests.support import transitions

BANNER = 'id="stuck-steps"'


def stale_step(store: WorkflowStore, *, waited: float, eta_in: float | None = None) -> str:
    """A step scheduled ``waited`` seconds ago that no worker has started."""
    run_id = store.create_run("mail", {})
    step_id = str(uuid.uuid4())
    now = dt.datetime.now(dt.timezone.utc)
    eta = None if eta_in is None else now + dt.timedelta(seconds=eta_in)
    transitions.schedule(
        store, run_id, "send", step_id=step_id, rpc_name="shop.send", data={}, eta=eta
    )
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(workflow_step)
            .where(workflow_step.c.workflow_step_id == step_id)
            .values(updated_at=now - dt.timedelta(seconds=waited))
        )
    return run_id


def test_no_warning_while_nothing_is_stuck(client: TestClient, seeded: Seeded) -> None:
    assert BANNER not in client.get("/").text
    got = samples(client.get("/metrics").text)
    assert got["pikku_celery_steps_lost"] == "0"
    assert got["pikku_celery_steps_scheduled_stale"] == "0"


def test_a_lost_step_is_explained_with_what_to_do(
    client: TestClient, store: WorkflowStore, seeded: Seeded
) -> None:
    lost_run(store)
    html = client.get("/").text
    assert BANNER in html
    assert "Lost steps: 1." in html
    assert "died or stopped answering" in html
    assert "<code>pikku-celery reap --app proj:pikku</code>" in html
    assert 'class="stale-steps"' not in html
    assert samples(client.get("/metrics").text)["pikku_celery_steps_lost"] == "1"


def test_a_step_no_worker_takes_is_reported_after_the_threshold(
    client: TestClient, store: WorkflowStore, seeded: Seeded
) -> None:
    stale_step(store, waited=300)  # not yet: the default threshold is 10 min
    assert BANNER not in client.get("/").text
    stale_step(store, waited=7200)
    # Held back on purpose until an hour from now: not late.
    stale_step(store, waited=7200, eta_in=3600)
    html = client.get("/").text
    assert "Steps waiting for a worker: 1</strong>, scheduled over 10 min ago" in html
    assert "consumes their queue" in html
    assert "<code>pikku-celery reap --app proj:pikku</code> lists them" in html
    assert 'class="lost-steps"' not in html
    text = client.get("/metrics").text
    assert samples(text)["pikku_celery_steps_scheduled_stale"] == "1"
    assert (
        "# HELP pikku_celery_steps_scheduled_stale Steps scheduled over 600 seconds ago "
        "(PIKKU_STALE_AFTER)"
    ) in text
    assert "# TYPE pikku_celery_steps_lost gauge" in text


def test_the_threshold_comes_from_the_environment(
    store: WorkflowStore, seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale_step(store, waited=7200)
    monkeypatch.setenv("PIKKU_STALE_AFTER", "10800")
    with TestClient(create_app(store)) as client:
        assert BANNER not in client.get("/").text
        text = client.get("/metrics").text
    assert samples(text)["pikku_celery_steps_scheduled_stale"] == "0"
    assert "over 10800 seconds ago" in text
    monkeypatch.setenv("PIKKU_STALE_AFTER", "5400")
    with TestClient(create_app(store)) as client:
        assert "scheduled over 1.5 h ago" in client.get("/").text
    # Given to create_app, it wins over the environment.
    with TestClient(create_app(store, stale_after=90)) as client:
        assert "scheduled over 1.5 min ago" in client.get("/").text


@pytest.mark.parametrize("value", ["ten minutes", "0", "-5", "nan", "1e12"])
def test_a_bad_threshold_in_the_environment_is_a_clear_error(
    store: WorkflowStore, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PIKKU_STALE_AFTER", value)
    with pytest.raises(ConfigurationError, match=r"PIKKU_STALE_AFTER .*seconds.*like 600"):
        create_app(store)


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf")])
def test_a_bad_threshold_given_is_a_clear_error(store: WorkflowStore, value: float) -> None:
    with pytest.raises(ConfigurationError, match="stale_after"):
        create_app(store, stale_after=value)
