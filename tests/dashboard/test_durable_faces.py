"""The run page of durable workflows: parent and child linked both ways, branches, waits,
events, and the "Send event" form with the same sign-in and CSRF guard as every action."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.dashboard import create_app
from tests.dashboard.conftest import PASSWORD, XSS, RecordingActions, Seeded, csrf_token
from tests.support.durable import Recorder, ShippedOrder, durable_pikku, settle, shipped_order

SIGNED_IN = ("anyone", PASSWORD)


@pytest.fixture
def pikku(store: WorkflowStore) -> Iterator[PikkuCelery]:
    with durable_pikku(store) as made:
        yield made


@pytest.fixture
def order(pikku: PikkuCelery) -> ShippedOrder:
    return shipped_order(pikku)


@pytest.fixture
def actions() -> RecordingActions:
    return RecordingActions()


@pytest.fixture
def secured(store: WorkflowStore, actions: RecordingActions) -> Iterator[TestClient]:
    with TestClient(create_app(store, actions=actions, auth_token=PASSWORD)) as client:
        yield client


SEND_FORM = re.compile(
    r'<form method="post" action="[^"]*/send" class="send-event">.*?</form>', re.S
)


def send_form(html: str) -> str | None:
    match = SEND_FORM.search(html)
    return None if match is None else match.group(0)


# --- reading ----------------------------------------------------------------------------


def test_the_parent_links_its_child_run_and_shows_the_branch_taken(
    client: TestClient, order: ShippedOrder
) -> None:
    html = client.get(f"/runs/{order.parent}").text
    size = re.search(r'<section class="step" data-step="size">.*?</section>', html, re.S)
    ship = re.search(r'<section class="step" data-step="ship">.*?</section>', html, re.S)
    assert size is not None and ship is not None
    assert '<dt>Branch taken</dt><dd class="branch"><code>big</code></dd>' in size.group(0)
    assert f'<dd class="child-run"><a href="/runs/{order.child}">' in ship.group(0)
    assert "Parent run" not in html
    assert "<h2>Events</h2>" in html and "No events sent yet." in html


def test_the_child_links_its_parent_step_and_shows_its_waits_and_events(
    client: TestClient, store: WorkflowStore, order: ShippedOrder
) -> None:
    html = client.get(f"/runs/{order.child}").text
    assert (
        f'<dd class="parent-run"><a href="/runs/{order.parent}"><code>{order.parent}</code></a>'
        ", step <code>ship</code></dd>"
    ) in html
    carrier = re.search(r'<section class="step" data-step="carrier">.*?</section>', html, re.S)
    assert carrier is not None
    deadline = store.get_step_state(order.child, "carrier").data["deadline"][:19]
    assert "<dt>Waiting for</dt>" in carrier.group(0)
    assert f"event <code>carrier</code> until {deadline.replace('T', ' ')}" in carrier.group(0)
    assert "<dt>Waited for</dt>" in html  # the "label" wait, which took its event

    rows = re.findall(r'<tr class="event" data-event-id="[^"]+">(.*?)</tr>', html, re.S)
    assert len(rows) == 2
    label, note = rows
    assert "<code>label</code>" in label
    assert f'<a href="#step-{order.label_step}">label</a>' in label
    assert f'id="step-{order.label_step}"' in html  # the link's target
    assert "&#34;label&#34;: &#34;L-7&#34;" in label
    assert "<code>note</code>" in note and "not taken yet" in note
    assert "&#34;call before noon&#34;" in note


def test_the_api_document_has_the_parent_and_the_events(
    client: TestClient, order: ShippedOrder
) -> None:
    child = client.get(f"/api/runs/{order.child}").json()
    assert child["parent"]["run_id"] == order.parent and child["parent"]["step_name"] == "ship"
    assert [e["name"] for e in child["events"]] == ["label", "note"]
    assert child["events"][0]["taken_by_step_id"] == order.label_step
    parent = client.get(f"/api/runs/{order.parent}").json()
    ship = {step["step_name"]: step for step in parent["steps"]}["ship"]
    assert ship["child_run_id"] == order.child


def test_runs_that_take_no_events_have_no_events_section(
    client: TestClient, seeded: Seeded
) -> None:
    assert "<h2>Events</h2>" not in client.get(f"/runs/{seeded.running}").text


def test_event_names_and_data_are_escaped(client: TestClient, store: WorkflowStore) -> None:
    run_id = store.create_run("refund", {}, wire={"type": "workflow"})
    store.workflows.send_event(run_id, f"approval {XSS}", {"note": XSS})
    html = client.get(f"/runs/{run_id}").text
    assert XSS not in html
    assert "<code>approval &lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;</code>" in html
    assert "&#34;note&#34;: &#34;&lt;script&gt;" in html


# --- the send form ------------------------------------------------------------------------


def test_the_form_is_offered_signed_in_on_a_waiting_workflow_run_only(
    store: WorkflowStore, order: ShippedOrder, seeded: Seeded, actions: RecordingActions
) -> None:
    with TestClient(create_app(store, actions=actions)) as read_only:
        assert send_form(read_only.get(f"/runs/{order.child}").text) is None
    with TestClient(create_app(store, auth_token=PASSWORD)) as without_actions:
        page = without_actions.get(f"/runs/{order.child}", auth=SIGNED_IN).text
        assert send_form(page) is None
    with TestClient(create_app(store, actions=actions, auth_token=PASSWORD)) as client:
        form = send_form(client.get(f"/runs/{order.child}", auth=SIGNED_IN).text)
        assert form is not None
        assert 'name="csrf_token"' in form
        assert 'name="name" value="carrier"' in form  # the event the run waits for
        assert '<textarea name="data"' in form
        completed = store.create_run("refund", {}, wire={"type": "workflow"}, status="completed")
        for run_id in (completed, seeded.running):  # ended; not a durable workflow
            assert send_form(client.get(f"/runs/{run_id}", auth=SIGNED_IN).text) is None
    assert actions.calls == []


def test_a_send_needs_a_password_a_sign_in_and_the_forms_token(
    store: WorkflowStore, order: ShippedOrder, actions: RecordingActions
) -> None:
    url = f"/runs/{order.child}/send"
    data = {"name": "carrier", "data": "{}"}
    with TestClient(create_app(store, actions=actions)) as read_only:
        refused = read_only.post(url, data=data)
        assert refused.status_code == 403 and "PIKKU_DASHBOARD_PASSWORD" in refused.text
    app = create_app(store, actions=actions, auth_token=PASSWORD)
    with TestClient(app) as client, TestClient(app) as attacker:
        assert client.post(url, data={**data, "csrf_token": "x"}).status_code == 401
        token = csrf_token(client.get(f"/runs/{order.child}", auth=SIGNED_IN).text)
        assert client.post(url, data=data, auth=SIGNED_IN).status_code == 403
        attacker.get(f"/runs/{order.child}", auth=SIGNED_IN)
        stolen = attacker.post(url, data={**data, "csrf_token": token}, auth=SIGNED_IN)
        assert stolen.status_code == 403 and "CSRF token" in stolen.text
        cross = client.post(
            url,
            data={**data, "csrf_token": token},
            auth=SIGNED_IN,
            headers={"sec-fetch-site": "cross-site"},
        )
        assert cross.status_code == 403
    assert actions.calls == []


def test_a_good_form_sends_the_event_with_its_json_data(
    secured: TestClient, order: ShippedOrder, actions: RecordingActions
) -> None:
    token = csrf_token(secured.get(f"/runs/{order.child}", auth=SIGNED_IN).text)
    url = f"/runs/{order.child}/send"
    done = secured.post(
        url,
        data={"csrf_token": token, "name": "carrier", "data": '{"carrier": "DHL"}'},
        auth=SIGNED_IN,
        follow_redirects=False,
    )
    assert done.status_code == 303
    assert done.headers["location"] == f"/runs/{order.child}?done=send"
    page = secured.post(url, data={"csrf_token": token, "name": "carrier"}, auth=SIGNED_IN)
    assert page.status_code == 200 and "Sent the event" in page.text
    assert actions.calls == [
        ("send", order.child, "carrier", {"carrier": "DHL"}),
        ("send", order.child, "carrier", None),  # no data: null
    ]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"name": "carrier", "data": "{carrier: <b>DHL</b>}"}, "is not JSON"),
        ({"name": "carrier", "data": "yes"}, "a text in double quotes"),
        ({"name": " ", "data": "{}"}, "Say which event to send"),
        ({"data": "{}"}, "Say which event to send"),
    ],
)
def test_a_form_without_a_name_or_with_data_that_is_not_json_sends_nothing(
    secured: TestClient,
    order: ShippedOrder,
    actions: RecordingActions,
    fields: dict[str, str],
    says: str,
) -> None:
    token = csrf_token(secured.get(f"/runs/{order.child}", auth=SIGNED_IN).text)
    refused = secured.post(
        f"/runs/{order.child}/send", data={"csrf_token": token, **fields}, auth=SIGNED_IN
    )
    assert refused.status_code == 400
    assert says in refused.text and "<b>" not in refused.text
    assert actions.calls == []


def test_through_the_real_engine_the_run_takes_the_event(
    store: WorkflowStore, pikku: PikkuCelery, order: ShippedOrder
) -> None:
    with TestClient(create_app(store, actions=pikku, auth_token=PASSWORD)) as client:
        token = csrf_token(client.get(f"/runs/{order.child}", auth=SIGNED_IN).text)
        sent = client.post(
            f"/runs/{order.child}/send",
            data={"csrf_token": token, "name": "carrier", "data": '"DHL"'},
            auth=SIGNED_IN,
        )
        assert sent.status_code == 200 and "Sent the event" in sent.text
        settle(pikku)
        assert store.get_run(order.child).output == {"label": {"label": "L-7"}, "carrier": "DHL"}
        assert store.get_run(order.parent).status == "completed"
        # Ended now: the form is gone, and a form still open in another tab is refused.
        page = client.get(f"/runs/{order.child}", auth=SIGNED_IN).text
        assert send_form(page) is None
        late = client.post(
            f"/runs/{order.child}/send",
            data={"csrf_token": token, "name": "carrier", "data": '"UPS"'},
            auth=SIGNED_IN,
        )
    assert late.status_code == 409
    assert "Could not send the event" in late.text and "resume/rerun this one first" in late.text
    assert [event.data for event in store.list_events(order.child)] == [
        {"label": "L-7"},
        "call before noon",
        "DHL",
    ]


def test_the_real_engine_refuses_runs_that_take_no_events(
    store: WorkflowStore, pikku: PikkuCelery, seeded: Seeded
) -> None:
    with TestClient(create_app(store, actions=pikku, auth_token=PASSWORD)) as client:
        token = csrf_token(client.get(f"/runs/{seeded.running}", auth=SIGNED_IN).text)
        data = {"csrf_token": token, "name": "approval", "data": "{}"}
        task = client.post(f"/runs/{seeded.running}/send", data=data, auth=SIGNED_IN)
        missing = client.post("/runs/no-such-run/send", data=data, auth=SIGNED_IN)
    assert task.status_code == 409 and "not a durable workflow" in task.text
    assert missing.status_code == 404 and "does not exist" in missing.text
    assert store.list_events(seeded.running) == []
    dispatcher = pikku.workflows.dispatcher
    assert isinstance(dispatcher, Recorder) and dispatcher.replays == []


def test_without_run_actions_a_send_is_not_available(
    store: WorkflowStore, order: ShippedOrder
) -> None:
    with TestClient(create_app(store, auth_token=PASSWORD)) as client:
        token = csrf_token(client.get(f"/runs/{order.child}", auth=SIGNED_IN).text)
        refused = client.post(
            f"/runs/{order.child}/send",
            data={"csrf_token": token, "name": "carrier"},
            auth=SIGNED_IN,
        )
    assert refused.status_code == 404 and "cannot send events to runs" in refused.text
    assert [event.name for event in store.list_events(order.child)] == ["label", "note"]
