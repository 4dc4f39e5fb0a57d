"""Actions need a configured password, a signed-in browser and the form's CSRF token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from pikku_celery import WorkflowStore
from pikku_celery.dashboard import RunActions, create_app
from pikku_celery.errors import RunNotFound, WorkflowError
from tests.dashboard.conftest import PASSWORD, RecordingActions, Seeded, csrf_token

SIGNED_IN = ("anyone", PASSWORD)


@pytest.fixture
def actions() -> RecordingActions:
    return RecordingActions()


@pytest.fixture
def secured(store: WorkflowStore, actions: RecordingActions) -> Iterator[TestClient]:
    app = create_app(store, actions=actions, auth_token=PASSWORD)
    with TestClient(app) as client:
        yield client


def test_the_recording_stand_in_is_a_run_actions(actions: RecordingActions) -> None:
    checked: RunActions = actions
    assert checked is actions


def test_without_a_password_actions_are_refused_with_how_to_enable_them(
    store: WorkflowStore, seeded: Seeded, actions: RecordingActions
) -> None:
    with TestClient(create_app(store, actions=actions)) as client:
        page = client.get(f"/runs/{seeded.running}").text
        assert "<form" not in page and "read-only" in page
        for action in ("resume", "rerun", "cancel", "delete"):
            refused = client.post(f"/runs/{seeded.running}/{action}", data={"step": "build"})
            assert refused.status_code == 403
            assert "PIKKU_DASHBOARD_PASSWORD" in refused.text
        assert client.get("/login").status_code == 404
    assert actions.calls == []
    assert store.get_run(seeded.running).status == "running"


def test_without_credentials_or_with_a_wrong_password_it_asks_to_sign_in(
    secured: TestClient, seeded: Seeded, actions: RecordingActions
) -> None:
    page = secured.get(f"/runs/{seeded.running}")
    assert page.status_code == 401
    assert "<form" not in page.text
    anonymous = secured.post(f"/runs/{seeded.running}/cancel", data={"csrf_token": "x"})
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Basic ")
    wrong = secured.post(
        f"/runs/{seeded.running}/cancel", data={"csrf_token": "x"}, auth=("anyone", "nope")
    )
    assert wrong.status_code == 401
    assert actions.calls == []


def test_a_missing_or_bad_csrf_token_is_refused(
    secured: TestClient, seeded: Seeded, actions: RecordingActions
) -> None:
    secured.get(f"/runs/{seeded.running}", auth=SIGNED_IN)  # gets the cookie
    url = f"/runs/{seeded.running}/cancel"
    assert secured.post(url, auth=SIGNED_IN).status_code == 403
    bad = secured.post(url, data={"csrf_token": "0" * 64}, auth=SIGNED_IN)
    assert bad.status_code == 403
    assert "CSRF token" in bad.text
    assert actions.calls == []


def test_a_token_is_only_good_with_its_own_cookie(
    store: WorkflowStore, seeded: Seeded, actions: RecordingActions
) -> None:
    app = create_app(store, actions=actions, auth_token=PASSWORD)
    with TestClient(app) as victim, TestClient(app) as attacker:
        stolen = csrf_token(victim.get(f"/runs/{seeded.running}", auth=SIGNED_IN).text)
        attacker.get(f"/runs/{seeded.running}", auth=SIGNED_IN)
        own = csrf_token(attacker.get(f"/runs/{seeded.running}", auth=SIGNED_IN).text)
        assert own != stolen
        url = f"/runs/{seeded.running}/cancel"
        assert attacker.post(url, data={"csrf_token": stolen}, auth=SIGNED_IN).status_code == 403
        # The right token, but a form another site posted.
        cross = victim.post(
            url,
            data={"csrf_token": stolen},
            auth=SIGNED_IN,
            headers={"sec-fetch-site": "cross-site"},
        )
        assert cross.status_code == 403
    assert actions.calls == []


def test_with_a_good_token_each_action_reaches_the_app(
    secured: TestClient, store: WorkflowStore, seeded: Seeded, actions: RecordingActions
) -> None:
    page = secured.get(f"/runs/{seeded.running}", auth=SIGNED_IN).text
    token = csrf_token(page)
    assert 'class="action-cancel"' in page and 'class="action-resume"' not in page

    done = secured.post(
        f"/runs/{seeded.running}/cancel",
        data={"csrf_token": token},
        auth=SIGNED_IN,
        follow_redirects=False,
    )
    assert done.status_code == 303
    assert done.headers["location"] == f"/runs/{seeded.running}?done=cancel"

    failed_page = secured.get(f"/runs/{seeded.failed}", auth=SIGNED_IN).text
    assert 'class="action-resume"' in failed_page and 'class="action-rerun"' in failed_page
    for action, data in (("resume", {}), ("rerun", {"step": "charge"})):
        response = secured.post(
            f"/runs/{seeded.failed}/{action}",
            data={"csrf_token": token, **data},
            auth=SIGNED_IN,
        )
        assert response.status_code == 200
        assert "Asked to" in response.text
    assert actions.calls == [
        ("cancel", seeded.running),
        ("resume", seeded.failed),
        ("rerun", seeded.failed, "charge"),
    ]


def test_delete_uses_the_store(secured: TestClient, store: WorkflowStore, seeded: Seeded) -> None:
    token = csrf_token(secured.get(f"/runs/{seeded.completed}", auth=SIGNED_IN).text)
    deleted = secured.post(
        f"/runs/{seeded.completed}/delete",
        data={"csrf_token": token},
        auth=SIGNED_IN,
        follow_redirects=False,
    )
    assert deleted.status_code == 303
    assert deleted.headers["location"] == f"/?deleted={seeded.completed}"
    with pytest.raises(RunNotFound):
        store.get_run(seeded.completed)
    again = secured.post(
        f"/runs/{seeded.completed}/delete", data={"csrf_token": token}, auth=SIGNED_IN
    )
    assert again.status_code == 404


def test_without_run_actions_only_delete_is_offered(store: WorkflowStore, seeded: Seeded) -> None:
    with TestClient(create_app(store, auth_token=PASSWORD)) as client:
        page = client.get(f"/runs/{seeded.failed}", auth=SIGNED_IN).text
        assert 'class="action-delete"' in page
        assert "action-resume" not in page and "action-rerun" not in page
        refused = client.post(
            f"/runs/{seeded.failed}/resume", data={"csrf_token": csrf_token(page)}, auth=SIGNED_IN
        )
        assert refused.status_code == 404


def test_an_action_that_fails_shows_its_message(store: WorkflowStore, seeded: Seeded) -> None:
    class Refusing(RecordingActions):
        def resume(self, run_id: str) -> None:
            raise WorkflowError("this run cannot <b>resume</b>")

    with TestClient(create_app(store, actions=Refusing(), auth_token=PASSWORD)) as client:
        token = csrf_token(client.get(f"/runs/{seeded.failed}", auth=SIGNED_IN).text)
        response = client.post(
            f"/runs/{seeded.failed}/resume", data={"csrf_token": token}, auth=SIGNED_IN
        )
    assert response.status_code == 409
    assert "this run cannot &lt;b&gt;resume&lt;/b&gt;" in response.text


def test_rerun_needs_a_step_and_unknown_actions_do_not_exist(
    secured: TestClient, seeded: Seeded, actions: RecordingActions
) -> None:
    token = csrf_token(secured.get(f"/runs/{seeded.failed}", auth=SIGNED_IN).text)
    url = f"/runs/{seeded.failed}"
    data = {"csrf_token": token}
    assert secured.post(f"{url}/rerun", data=data, auth=SIGNED_IN).status_code == 400
    assert secured.post(f"{url}/explode", data=data, auth=SIGNED_IN).status_code == 404
    assert actions.calls == []


def test_sign_in_redirects_only_within_the_site(secured: TestClient) -> None:
    assert secured.get("/login").status_code == 401
    back = secured.get("/login?next=/runs/x", auth=SIGNED_IN, follow_redirects=False)
    assert back.headers["location"] == "/runs/x"
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        away = secured.get(
            "/login", params={"next": target}, auth=SIGNED_IN, follow_redirects=False
        )
        assert away.headers["location"] == "/"
