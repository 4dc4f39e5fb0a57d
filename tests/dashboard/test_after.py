"""What each step comes after, and which attempts link to Flower: a chord's body after every
task of its header, a compensation after the step whose failure it handles, and no Flower link
for a sleep, a wait or a child workflow, whose ids no Celery task carries.

Runs made by the real mirror and engine: the inline runner publishes each message through
Celery and runs it through Celery's worker code, into the test's database (SQLite and
PostgreSQL). The page, the API document and ``runs show`` must agree.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from starlette.testclient import TestClient

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.cli import commands as cli
from pikku_celery.dashboard import create_app
from pikku_celery.errors import StepFailed
from pikku_celery.testing import InlineRunner
from tests.support.durable import durable_pikku, shipped_order

NOWHERE = "redis://127.0.0.1:9/0"  # nothing listens: a message that leaked would fail
FLOWER = "http://flower.example:5555"


@dataclass
class Shop:
    pikku: PikkuCelery
    runner: InlineRunner
    url: str


@pytest.fixture
def shop(store: WorkflowStore) -> Iterator[Shop]:
    app = Celery(f"after_{uuid.uuid4().hex[:8]}", broker=NOWHERE, set_as_current=False)
    url = store.engine.url.render_as_string(hide_password=False)
    pikku = PikkuCelery(app, store=store)
    try:
        with InlineRunner(pikku, database_url=url, fast_forward=True) as runner:
            yield Shop(pikku, runner, url)
    finally:
        pikku.uninstall()
        app.close()


def canvas(shop: Shop) -> str:
    """A chain into a chord of three, then a plain group: one run."""
    pikku = shop.pikku

    @pikku.step(shared=False)
    def first() -> int:
        return 1

    @pikku.step(shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @pikku.step(shared=False)
    def total(values: list[int]) -> int:
        return sum(values)

    signature = chain(first.s(), chord([add.s(1), add.s(2), add.s(3)], total.s()))
    run = shop.runner.run(signature, name="totals")
    assert (run.status, run.output) == ("completed", 9)
    return run.run_id


def order(shop: Shop) -> str:
    """A durable workflow that compensates twice, sleeps, and waits for an event."""
    pikku = shop.pikku

    @pikku.step(shared=False)
    def reserve() -> str:
        return "reserved"

    @pikku.step(shared=False)
    def charge() -> str:
        raise RuntimeError("card declined")

    @pikku.step(shared=False)
    def refund() -> str:
        return "refunded"

    @pikku.step(shared=False)
    def pack() -> str:
        return "packed"

    @pikku.step(shared=False)
    def label() -> str:
        raise RuntimeError("no label printer")

    @pikku.step(shared=False)
    def apologise() -> str:
        return "sorry"

    @pikku.workflow("order")
    def workflow(ctx: Any) -> str:
        ctx.do("reserve", reserve)
        try:
            ctx.do("charge", charge)
        except StepFailed:
            ctx.do("refund", refund)
        ctx.sleep("cool-off", seconds=1)
        try:
            ctx.do_all([("pack", pack), ("label", label)])
        except StepFailed:
            ctx.do("apologise", apologise)
        ctx.wait_for("review")
        return "done"

    run = shop.runner.start(workflow)
    assert run.status == "suspended", run.error  # waiting for its review
    return run.run_id


def page_after(html: str) -> dict[str, str]:
    """Each step's "after", as the run page shows it."""
    shown = {}
    for section in re.findall(r'<section class="step".*?</section>', html, re.S):
        name = re.search(r'data-step="([^"]*)"', section)
        after = re.search(r'<span class="after">after ([^<]*)</span>', section)
        assert name is not None
        shown[name.group(1)] = after.group(1) if after else ""
    return shown


def cli_after(url: str, run_id: str, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """Each step's "after", as ``runs show`` prints it."""
    assert cli.main(["runs", "show", run_id, "--database-url", url]) == 0
    table = capsys.readouterr().out.split("\n\nsteps\n")[1].split("\n\n")[0].splitlines()
    start = table[0].index("after")
    end = table[0].index("detail") if "detail" in table[0] else None
    return {line.split()[0]: line[start:end].strip() for line in table[2:]}


def api_after(client: TestClient, run_id: str) -> dict[str, list[str]]:
    steps = client.get(f"/api/runs/{run_id}").json()["steps"]
    return {step["step_name"]: step["after"] for step in steps}


def test_a_chord_body_comes_after_every_task_of_its_header(
    shop: Shop, store: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = canvas(shop)
    recorded = {s.step_name: s.from_step_name for s in store.list_step_states(run_id)}
    # What the row records: one header task, the last to end.
    assert recorded["total"] in {"add", "add#2", "add#3"}
    expected = {
        "first": [],
        "add": ["first"],
        "add#2": ["first"],
        "add#3": ["first"],
        "total": ["add", "add#2", "add#3"],
    }
    with TestClient(create_app(store)) as client:
        assert api_after(client, run_id) == expected
        assert page_after(client.get(f"/runs/{run_id}").text) == {
            name: ", ".join(names) for name, names in expected.items()
        }
        document = client.get(f"/api/runs/{run_id}").json()
    body = next(step for step in document["steps"] if step["step_name"] == "total")
    assert body["from_step_name"] == recorded["total"]  # the row as it is, beside it
    assert cli_after(shop.url, run_id, capsys) == {
        name: ", ".join(names) for name, names in expected.items()
    }


def test_a_group_and_a_chain_keep_the_step_their_rows_record(
    shop: Shop, store: WorkflowStore
) -> None:
    pikku = shop.pikku

    @pikku.step(shared=False)
    def pair(x: int) -> list[int]:
        return [x, x]  # a list, as a chord's body gets: still no chord here

    @pikku.step(shared=False)
    def size(values: list[int]) -> int:
        return len(values)

    run = shop.runner.run(group(chain(pair.s(1), size.s()), pair.s(2)), name="mixed")
    assert run.status == "completed"
    with TestClient(create_app(store)) as client:
        assert api_after(client, run.run_id) == {"pair": [], "size": ["pair"], "pair#2": []}


def test_a_compensation_comes_after_the_step_whose_failure_it_handles(
    shop: Shop, store: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = order(shop)
    recorded = {s.step_name: s.from_step_name for s in store.list_step_states(run_id)}
    assert recorded["refund"] == "reserve"  # the engine's record: the last step that returned
    expected = {
        "reserve": [],
        "charge": ["reserve"],
        "refund": ["charge"],
        "cool-off": ["refund"],
        # One ctx.do_all: both after what came before it, neither after the other,
        # though "label" failed before "pack" was read again.
        "pack": ["cool-off"],
        "label": ["cool-off"],
        "apologise": ["label"],
        "review": ["apologise"],
    }
    with TestClient(create_app(store, flower_url=FLOWER)) as client:
        assert api_after(client, run_id) == expected
        assert page_after(client.get(f"/runs/{run_id}").text) == {
            name: ", ".join(names) for name, names in expected.items()
        }
    assert cli_after(shop.url, run_id, capsys) == {
        name: ", ".join(names) for name, names in expected.items()
    }


def flower_links(html: str) -> dict[str, int]:
    links = {}
    for section in re.findall(r'<section class="step".*?</section>', html, re.S):
        name = re.search(r'data-step="([^"]*)"', section)
        assert name is not None
        links[name.group(1)] = section.count('class="flower"')
    return links


def test_only_celery_tasks_link_to_flower(shop: Shop, store: WorkflowStore) -> None:
    run_id = order(shop)
    history = {a.step_name: a for a in store.get_run_history(run_id)}
    assert history["cool-off"].task_id is not None  # an id Flower would not know
    with TestClient(create_app(store, flower_url=FLOWER)) as client:
        links = flower_links(client.get(f"/runs/{run_id}").text)
        steps = client.get(f"/api/runs/{run_id}").json()["steps"]
    assert links == {
        "reserve": 1,
        "charge": 1,
        "refund": 1,
        "cool-off": 0,  # pikku.sleep
        "pack": 1,
        "label": 1,
        "apologise": 1,
        "review": 0,  # pikku.wait
    }
    for step in steps:
        urls = [attempt["flower_url"] for attempt in step["attempts"]]
        if step["step_name"] in ("cool-off", "review"):
            assert urls == [None] * len(urls), step["step_name"]
        else:
            assert urls and all(url and url.startswith(f"{FLOWER}/task/") for url in urls)


def test_a_child_workflow_step_does_not_link_to_flower(store: WorkflowStore) -> None:
    with durable_pikku(store) as pikku:
        order = shipped_order(pikku)
    ship = next(a for a in store.get_run_history(order.parent) if a.step_name == "ship")
    assert ship.task_id == order.child  # the child run's id, not a Celery task's
    with TestClient(create_app(store, flower_url=FLOWER)) as client:
        html = client.get(f"/runs/{order.parent}").text
        document = client.get(f"/api/runs/{order.parent}").json()
    assert flower_links(html)["ship"] == 0
    assert f"{FLOWER}/task/{order.child}" not in html
    [ship_step] = [s for s in document["steps"] if s["step_name"] == "ship"]
    assert [a["flower_url"] for a in ship_step["attempts"]] == [None]
