"""``runs show`` and ``runs send`` for durable workflows' child runs, waits, branches and events.

In process, on a real database (SQLite and PostgreSQL), with runs the real
engine made; ``runs send`` loads its app by ``--app`` from a module of the
test's own, whose replays are recorded rather than published.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.cli import commands as cli
from pikku_celery.cli import common as codes
from tests.support import transitions
from tests.support.durable import Recorder, ShippedOrder, durable_pikku, settle, shipped_order

APP_MODULE = "faces_send_app"


@pytest.fixture
def pikku(store: WorkflowStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[PikkuCelery]:
    """The users' PikkuCelery, importable as ``--app faces_send_app:pikku``."""
    with durable_pikku(store) as made:
        module = ModuleType(APP_MODULE)
        module.pikku = made  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, APP_MODULE, module)
        yield made


@pytest.fixture
def order(pikku: PikkuCelery) -> ShippedOrder:
    return shipped_order(pikku)


def database(store: WorkflowStore) -> list[str]:
    return ["--database-url", store.engine.url.render_as_string(hide_password=False)]


def show(store: WorkflowStore, run_id: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main([*database(store), "runs", "show", run_id]) == codes.EXIT_OK
    return capsys.readouterr().out


def test_show_links_a_parent_to_its_child_and_names_its_branch(
    store: WorkflowStore, order: ShippedOrder, capsys: pytest.CaptureFixture[str]
) -> None:
    text = show(store, order.parent, capsys)
    steps = text.split("\n\nsteps\n")[1].split("\n\n")[0].splitlines()
    assert steps[0].split() == ["step", "task", "status", "attempts", "after", "detail"]
    size = next(line for line in steps if line.startswith("size "))
    ship = next(line for line in steps if line.startswith("ship "))
    assert size.endswith("branch taken: big")
    assert "pikku.workflow:ship" in ship and ship.endswith(f"child run {order.child}")
    assert "\nparent " not in text and "\n\nevents" not in text


def test_show_names_a_child_runs_parent_its_waits_and_its_events(
    store: WorkflowStore, order: ShippedOrder, capsys: pytest.CaptureFixture[str]
) -> None:
    text = show(store, order.child, capsys)
    assert f"parent    run {order.parent}, step ship\n" in text
    carrier = store.get_step_state(order.child, "carrier")
    deadline = carrier.data["deadline"][:19].replace("T", " ")
    assert f"waiting for event carrier until {deadline} UTC" in text
    assert "waited for event label" in text
    events = text.split("\n\nevents (times UTC, ")[1].splitlines()
    assert events[1].split() == ["event", "sent", "taken", "by", "taken", "data"]
    label = next(line for line in events if line.startswith("label "))
    note = next(line for line in events if line.startswith("note "))
    assert "  label  " in label and label.endswith('{"label": "L-7"}')
    assert "not taken yet" in note and note.endswith('"call before noon"')


def test_show_json_has_the_parent_the_events_and_each_steps_child_branch_and_wait(
    store: WorkflowStore, order: ShippedOrder, capsys: pytest.CaptureFixture[str]
) -> None:
    db = database(store)
    assert cli.main([*db, "runs", "show", order.parent, "--json"]) == codes.EXIT_OK
    parent = json.loads(capsys.readouterr().out)
    assert parent["parent"] is None and parent["events"] == []
    steps = {step["step_name"]: step for step in parent["steps"]}
    assert steps["size"]["branch_taken"] == "big" and steps["size"]["child_run_id"] is None
    assert steps["ship"]["child_run_id"] == order.child and steps["ship"]["wait"] is None

    assert cli.main([*db, "runs", "show", order.child, "--json"]) == codes.EXIT_OK
    child = json.loads(capsys.readouterr().out)
    assert child["parent"] == {
        "run_id": order.parent,
        "step_id": order.ship_step,
        "step_name": "ship",
    }
    carrier = {step["step_name"]: step for step in child["steps"]}["carrier"]
    assert carrier["wait"]["event"] == "carrier" and carrier["wait"]["waiting"] is True
    assert carrier["wait"]["deadline"] == carrier["data"]["deadline"]
    [label, note] = child["events"]
    assert (label["name"], label["data"], label["taken_by_step_name"]) == (
        "label",
        {"label": "L-7"},
        "label",
    )
    assert label["taken_by_step_id"] == order.label_step and label["taken_at"] is not None
    assert (note["name"], note["taken_by_step_id"], note["taken_at"]) == ("note", None, None)


def test_show_of_a_run_without_waits_or_children_is_as_it_was(
    store: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = store.create_run("report", {})
    transitions.schedule(store, run_id, "build", step_id="s1", rpc_name="shop.build", data={})
    text = show(store, run_id, capsys)
    assert text.split("\n\nsteps\n")[1].splitlines()[0].split() == [
        "step",
        "task",
        "status",
        "attempts",
        "after",
    ]
    assert "parent" not in text and "events" not in text


def send(store: WorkflowStore, *args: str) -> int:
    return cli.main([*database(store), "--app", f"{APP_MODULE}:pikku", "runs", "send", *args])


def test_send_keeps_the_event_and_replays_the_run_which_takes_it(
    store: WorkflowStore,
    pikku: PikkuCelery,
    order: ShippedOrder,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert send(store, order.child, "carrier", "--data", '{"carrier": "DHL"}') == codes.EXIT_OK
    out = capsys.readouterr().out
    sent = store.list_events(order.child)[-1]
    assert (sent.name, sent.data, sent.taken_by_step_id) == ("carrier", {"carrier": "DHL"}, None)
    assert out.startswith(f"Sent event carrier to run {order.child} (event {sent.event_id})")
    dispatcher = pikku.workflows.dispatcher
    assert isinstance(dispatcher, Recorder) and (order.child, None) in dispatcher.replays
    settle(pikku)
    output = store.get_run(order.child).output
    assert output == {"label": {"label": "L-7"}, "carrier": {"carrier": "DHL"}}
    assert store.get_run(order.parent).status == "completed"


def test_send_without_data_sends_null_and_json_prints_the_event_id(
    store: WorkflowStore, order: ShippedOrder, capsys: pytest.CaptureFixture[str]
) -> None:
    assert send(store, order.child, "carrier", "--json") == codes.EXIT_OK
    printed = json.loads(capsys.readouterr().out)
    sent = store.list_events(order.child)[-1]
    assert printed == {
        "event_id": sent.event_id,
        "run_id": order.child,
        "name": "carrier",
        "data": None,
    }
    assert sent.data is None


def test_data_that_is_not_json_says_how_to_quote_it_and_sends_nothing(
    store: WorkflowStore, order: ShippedOrder, capsys: pytest.CaptureFixture[str]
) -> None:
    before = store.list_events(order.child)
    for data in ("{approved: true}", "yes"):
        with pytest.raises(SystemExit) as exited:
            send(store, order.child, "carrier", "--data", data)
        assert exited.value.code == codes.EXIT_USAGE
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and error.startswith("error: argument --data: ")
        assert "is not JSON" in error and """--data '{"approved": true}'""" in error
    assert store.list_events(order.child) == before


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("missing", "does not exist; check the run id"),
        ("settled", "send it to a running or suspended run, or resume/rerun this one first"),
        ("task", "is not a durable workflow run, so nothing in it waits for events"),
        ("blank name", "An event needs a name"),
    ],
)
def test_a_send_that_cannot_be_taken_says_what_to_do_and_writes_nothing(
    store: WorkflowStore,
    pikku: PikkuCelery,
    capsys: pytest.CaptureFixture[str],
    target: str,
    says: str,
) -> None:
    name = "approval"
    if target == "missing":
        run_id = "no-such-run"
    elif target == "settled":
        run_id = store.create_run("refund", {}, wire={"type": "workflow"}, status="completed")
    elif target == "task":
        run_id = store.create_run("shop.charge", {}, wire={"type": "task"})
    else:
        run_id, name = store.create_run("refund", {}, wire={"type": "workflow"}), " "
    assert send(store, run_id, name, "--data", "1") == codes.EXIT_ERROR
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: "), error
    assert says in error
    if target != "missing":
        assert store.list_events(run_id) == []
    dispatcher = pikku.workflows.dispatcher
    assert isinstance(dispatcher, Recorder) and dispatcher.replays == []


def test_send_needs_the_app(store: WorkflowStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*database(store), "runs", "send", "r1", "approval"]) == codes.EXIT_ERROR
    error = capsys.readouterr().err
    assert "pass --app module:attribute" in error and "PIKKU_CELERY_APP" in error


def test_send_help_names_its_environment_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["runs", "send", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("PIKKU_SEND_DATA", "PIKKU_JSON", "PIKKU_CELERY_APP"):
        assert f"[env: {name}]" in text, name
