"""The mirror's ordering rules, each on its own, with no database (``mirror/ordering.py``).

Their tests against the store, on both databases: ``tests/integration/test_ordering.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pikku_celery.mirror.events import (
    Adoption,
    AttemptEnded,
    AttemptStarted,
    AttemptSucceeded,
    MirrorEvent,
    ResultStored,
    StepPublished,
    new_event_id,
)
from pikku_celery.mirror.ordering import (
    Holds,
    adopts,
    overdue,
    parent_link,
    waits_for_its_step,
)

RUN, OTHER_RUN = "run-1", "run-2"


@dataclass(frozen=True)
class Queued:
    seq: int
    event: MirrorEvent


def publish(step_id: str, run_id: str = RUN, parent: str | None = None) -> StepPublished:
    return StepPublished(
        id=new_event_id(),
        at=0.0,
        step_id=step_id,
        run_id=run_id,
        step_name="add",
        rpc_name="shop.add",
        data_json="{}",
        parent_step_id=parent,
    )


def start(step_id: str) -> AttemptStarted:
    return AttemptStarted(id=new_event_id(), at=0.0, step_id=step_id, attempt=1, worker="w", pid=1)


def success(step_id: str, run_id: str | None = RUN) -> AttemptSucceeded:
    return AttemptSucceeded(
        id=new_event_id(), at=0.0, step_id=step_id, attempt=1, run_id=run_id, result_json="2"
    )


def result(step_id: str) -> ResultStored:
    return ResultStored(
        id=new_event_id(), at=0.0, step_id=step_id, attempt=1, state="SUCCESS", meta_b64=""
    )


def adoption(*, published: bool) -> Adoption:
    return Adoption(run_id=RUN, step_name="add", rpc_name="shop.add", published=published)


def holding(*deferred: Queued) -> Holds:
    holds = Holds()
    for item in deferred:
        holds.deferred(item)
    return holds


def test_an_event_of_a_step_its_batch_found_missing_waits_for_it() -> None:
    assert waits_for_its_step(start("a"), {"a"})
    assert waits_for_its_step(result("a"), {"a", "b"})
    assert not waits_for_its_step(start("a"), {"b"})
    assert not waits_for_its_step(start("a"), set())


def test_an_event_is_overdue_only_once_it_waited_past_its_grace() -> None:
    assert not overdue(None, now=1_000.0, grace=60.0)  # never deferred: it waited for nothing
    assert not overdue(900.0, now=950.0, grace=60.0)
    assert not overdue(900.0, now=960.0, grace=60.0)
    assert overdue(900.0, now=960.5, grace=60.0)


def test_a_step_nobody_published_is_adopted_at_once_a_published_one_once_overdue() -> None:
    assert adopts(adoption(published=False), overdue=False)
    assert adopts(adoption(published=False), overdue=True)
    assert not adopts(adoption(published=True), overdue=False)
    assert adopts(adoption(published=True), overdue=True)


def test_a_new_step_keeps_the_step_it_follows_until_it_is_overdue() -> None:
    assert parent_link(publish("b", parent="a"), overdue=False) == "a"
    assert parent_link(publish("b", parent="a"), overdue=True) is None
    assert parent_link(publish("b"), overdue=False) is None


def test_an_event_waits_behind_an_earlier_event_of_its_step_that_waits() -> None:
    holds = holding(Queued(5, start("a")))
    # A redelivery's start, the attempt's end, its result: behind the first start.
    assert holds.behind_its_step(Queued(7, start("a")), taken=())
    assert holds.behind_its_step(Queued(8, success("a")), taken=())
    assert holds.behind_its_step(Queued(9, result("a")), taken=())
    assert not holds.behind_its_step(Queued(3, success("a")), taken=())  # before it
    assert not holds.behind_its_step(Queued(7, success("b")), taken=())  # another step
    assert not holds.behind_its_step(Queued(7, success("a")), taken={5})  # written first


def test_an_event_waits_behind_every_earlier_event_of_its_step_that_waits() -> None:
    """Two events of a step deferred at two flushes come due at two moments: one written
    ahead of the other does not let what follows both overtake the other."""
    holds = holding(Queued(5, start("a")), Queued(6, start("a")))
    assert holds.behind_its_step(Queued(8, success("a")), taken={5})
    assert not holds.behind_its_step(Queued(8, success("a")), taken={5, 6})


def test_a_steps_success_waits_behind_an_earlier_publish_of_its_run_that_waits() -> None:
    holds = holding(Queued(5, publish("next", parent="a")))
    assert holds.behind_a_publish_of_its_run(Queued(7, success("a")), taken=())
    assert not holds.behind_a_publish_of_its_run(Queued(3, success("a")), taken=())
    assert not holds.behind_a_publish_of_its_run(Queued(7, success("a", OTHER_RUN)), taken=())
    assert not holds.behind_a_publish_of_its_run(Queued(7, success("a")), taken={5})
    # Only a success completes a run: a start or a failure of its steps goes on.
    assert not holds.behind_a_publish_of_its_run(Queued(7, start("a")), taken=())
    failure = AttemptEnded(
        id=new_event_id(),
        at=0.0,
        step_id="a",
        attempt=1,
        run_id=RUN,
        status="failed",
        error_json="{}",
    )
    assert not holds.behind_a_publish_of_its_run(Queued(7, failure), taken=())


def test_a_success_waits_for_the_publish_itself_not_for_any_event_of_that_step() -> None:
    """The link's start, due before its publish, is written ahead of the success: the
    success still waits for the publish (a chain's run once ended without its link)."""
    holds = holding(Queued(5, publish("next", parent="a")))
    assert holds.behind_a_publish_of_its_run(Queued(7, success("a")), taken={6})
    started_only = holding(Queued(5, start("next")))
    assert not started_only.behind_a_publish_of_its_run(Queued(7, success("a")), taken=())


def test_what_left_its_journal_holds_nothing() -> None:
    first, link = Queued(5, start("a")), Queued(6, publish("next", parent="a"))
    holds = holding(first, link)
    assert holds
    holds.left(first)  # written, or set aside
    assert not holds.behind_its_step(Queued(7, success("a")), taken=())
    assert holds.behind_a_publish_of_its_run(Queued(7, success("a")), taken=())
    holds.left(link)
    assert not holds.waits(Queued(7, success("a")), taken=())
    assert not holds


def test_a_batch_decides_in_order_so_one_that_waits_holds_back_those_behind_it() -> None:
    """The link's publish waits behind an earlier event of its step; the success behind
    that publish, in the same batch, waits for it too."""
    holds = holding(Queued(3, start("next")))
    lane = [Queued(5, publish("next", parent="a")), Queued(7, success("a")), Queued(8, start("b"))]
    assert holds.behind(lane) == lane[:2]
    again = holding(Queued(3, start("next")))  # the one it waits for is due, and goes first
    assert again.behind([Queued(3, start("next")), Queued(9, success("next"))]) == []
