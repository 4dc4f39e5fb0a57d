"""Which message its worker records at once, from the message alone (a lone task), and
which waits for its publisher's journal: decided from the messages Celery really sends."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery, chain, chord, group
from celery.app.task import Context

from pikku_celery import PikkuCelery
from pikku_celery.integration import headers as h
from pikku_celery.integration.signals import lone


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Celery]:
    app = Celery(
        f"lone_{uuid.uuid4().hex[:8]}",
        broker="memory://",
        backend="cache+memory://",
        set_as_current=False,
    )
    # The memory transport's queues are shared by every app of this process.
    app.conf.task_default_queue = f"lone-{uuid.uuid4().hex}"
    pikku = PikkuCelery(app, f"sqlite:///{tmp_path / 'p.db'}", mirror="all")

    @app.task(name="lone.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="lone.total", shared=False)
    def total(values: list[int]) -> int:
        return sum(values)

    yield app
    pikku.uninstall()


def sent(app: Celery) -> dict[str, bool]:
    """Each message in the queue, by task id: whether its worker would find it lone."""
    decided: dict[str, bool] = {}
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(app.conf.task_default_queue)
        try:
            while True:
                try:
                    message = queue.get(timeout=0.1)
                except queue.Empty:
                    return decided
                headers = dict(message.headers)
                embed = message.payload[2]
                # What the worker's request holds: the headers, and the body's embed.
                request = Context(headers=headers, **headers, chord=embed.get("chord"))
                step_id = str(headers["id"])
                decided[step_id] = lone(request, step_id, h.from_request(request, h.RUN_ID))
                message.ack()
        finally:
            queue.close()


def test_a_task_sent_on_its_own_is_lone(app: Celery) -> None:
    result = app.tasks["lone.add"].delay(1, 2)
    assert sent(app) == {result.id: True}


def test_a_chains_links_wait_for_their_publish(app: Celery) -> None:
    add = app.tasks["lone.add"]
    # The last link has the run's id (the chain's result id) but the first link's root.
    links = chain(add.s(1, 1), add.s(2), add.s(3))
    result = links.apply_async()
    decided = sent(app)
    assert list(decided.values()) == [False]
    # The first link goes under the last link's id as its run: not its own.
    assert result.id not in decided


def test_a_chords_header_tasks_wait_for_their_publish(app: Celery) -> None:
    # Which header task's run holds the chord for its body follows the order they were
    # published in: the worker of a later one must not write its run first.
    add, total = app.tasks["lone.add"], app.tasks["lone.total"]
    header = [add.s(1, 1), add.s(2, 2)]
    ids = [signature.freeze().id for signature in header]
    chord(header, total.s()).apply_async()
    assert sent(app) == dict.fromkeys(ids, False)


def test_a_groups_members_are_lone(app: Celery) -> None:
    add = app.tasks["lone.add"]
    members = [add.s(1, 1), add.s(2, 2)]
    ids = [signature.freeze().id for signature in members]
    group(members).apply_async()
    assert sent(app) == dict.fromkeys(ids, True)
