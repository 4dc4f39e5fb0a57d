"""The mirror's ordering rules against the store, each on its own, on both databases.

Journals are appended to and written here one flush at a time, by a batch writer whose
deferred events come due only when a test says so (:func:`due_now`): what each flush
holds, and what waits, is the test's choice, never the clock's.
"""

from __future__ import annotations

import base64
import json
import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.mirror.batches import BATCH_SIZE, BatchWriter
from pikku_celery.mirror.deferral import GRACE, Deferral
from pikku_celery.mirror.events import (
    Adoption,
    AttemptEnded,
    AttemptStarted,
    AttemptSucceeded,
    MirrorEvent,
    ResultStored,
    StepPublished,
    encode,
    new_event_id,
)
from pikku_celery.mirror.journal import Journal
from pikku_celery.mirror.outage import Outage

# A deferred event is tried again only when a test makes it due.
_LATER: Final = 3600.0
# Every event deferred once is overdue the next time it is tried, whatever the clock says.
NO_GRACE: Final = -1.0


class Writer:
    """A batch writer over journals that a test appends events to."""

    def __init__(self, store: WorkflowStore, folder: Path, *, grace: float = GRACE) -> None:
        self.folder = folder
        self.journals: list[Journal] = []
        self.batches = BatchWriter(
            lambda: store,
            batch_size=BATCH_SIZE,
            deferral=Deferral(flush_interval=_LATER, grace=grace),
            outage=Outage(),
            own_journal=lambda: None,
            committed=lambda runs: None,
            fired=lambda chords: None,
        )

    def journal(self) -> Journal:
        """A process's journal."""
        journal = Journal(self.folder / f"{uuid.uuid4().hex}.journal")
        self.journals.append(journal)
        return journal

    def flush(self, journal: Journal) -> None:
        assert self.batches.flush_journal(journal)

    def close(self) -> None:
        for journal in self.journals:
            journal.close()


@pytest.fixture
def writer(store: WorkflowStore, tmp_path: Path) -> Iterator[Writer]:
    made = Writer(store, tmp_path)
    yield made
    made.close()


@pytest.fixture
def impatient(store: WorkflowStore, tmp_path: Path) -> Iterator[Writer]:
    """A writer with no grace: an event deferred once is overdue when tried again."""
    made = Writer(store, tmp_path, grace=NO_GRACE)
    yield made
    made.close()


def append(journal: Journal, *events: MirrorEvent) -> None:
    for event in events:
        journal.append(event.kind, encode(event))


def due_now(journal: Journal) -> None:
    """Every event deferred in ``journal`` is due again now (it keeps when it first waited)."""
    waiting = [e.seq for e in journal.peek(BATCH_SIZE, math.inf) if e.deferred_since is not None]
    journal.defer(waiting, 0.0, 0.0)


def depth(journal: Journal) -> tuple[int, int]:
    """(events waiting in line, events set aside)."""
    return journal.depth(), journal.set_aside_count()


def lone(step_id: str) -> StepPublished:
    """A task published on its own: its run is made with it, under its id."""
    return StepPublished(
        id=new_event_id(),
        at=time.time(),
        step_id=step_id,
        run_id=step_id,
        step_name="charge",
        rpc_name="shop.charge",
        data_json='{"args": [1], "kwargs": {}}',
        new_run=("shop.charge", '{"args": [1]}', '{"type": "task"}'),
    )


def link(run_id: str, step_id: str, parent: str | None = None) -> StepPublished:
    """A chain's link, sent by the link before it (``parent``)."""
    return StepPublished(
        id=new_event_id(),
        at=time.time(),
        step_id=step_id,
        run_id=run_id,
        step_name="add",
        rpc_name="shop.add",
        data_json='{"args": [1], "kwargs": {}}',
        parent_step_id=parent,
    )


def started(step_id: str, *, pid: int = 1, adoption: Adoption | None = None) -> AttemptStarted:
    return AttemptStarted(
        id=new_event_id(),
        at=time.time(),
        step_id=step_id,
        attempt=1,
        worker="w",
        pid=pid,
        adoption=adoption,
    )


def succeeded(step_id: str, run_id: str) -> AttemptSucceeded:
    return AttemptSucceeded(
        id=new_event_id(),
        at=time.time(),
        step_id=step_id,
        attempt=1,
        run_id=run_id,
        result_json="7",
    )


def result_stored(step_id: str) -> ResultStored:
    meta = json.dumps({"status": "SUCCESS", "result": 7}).encode()
    return ResultStored(
        id=new_event_id(),
        at=time.time(),
        step_id=step_id,
        attempt=1,
        state="SUCCESS",
        meta_b64=base64.b64encode(meta).decode("ascii"),
    )


def adoption_of(run_id: str, *, published: bool) -> Adoption:
    return Adoption(
        run_id=run_id,
        step_name="add",
        rpc_name="shop.add",
        published=published,
        data_json=None if published else '{"args": [3], "kwargs": {}}',
    )


def chain(store: WorkflowStore) -> str:
    return store.create_run("chain", None, wire={"type": "canvas"})


def steps(store: WorkflowStore, run_id: str) -> dict[str, str]:
    return {s.step_name: s.status for s in store.list_step_states(run_id)}


def the_success_waits_for_the_link(
    store: WorkflowStore, writer: Writer, worker: Journal, run_id: str, *, before: dict[str, str]
) -> None:
    """The worker's three events wait (the run stays open with ``before``), then, once due,
    land: the first link succeeded, the next one runs, and the run is still open."""
    assert depth(worker) == (3, 0)
    assert steps(store, run_id) == before
    assert store.get_run(run_id).status == "running"
    due_now(worker)
    writer.flush(worker)
    assert depth(worker) == (0, 0)
    assert steps(store, run_id) == {"add": "succeeded", "add#2": "running"}
    assert store.get_run(run_id).status == "running"


# --- across processes: a step's events wait for its publish, for at most its grace --------


def test_an_event_waits_for_its_steps_publish_from_another_journal(
    store: WorkflowStore, writer: Writer
) -> None:
    """``waits_for_its_step``: the start is not lost, nor written as a step of its own."""
    publisher, worker = writer.journal(), writer.journal()
    step_id = str(uuid.uuid4())
    append(publisher, lone(step_id))
    append(worker, started(step_id))
    writer.flush(worker)
    assert depth(worker) == (1, 0)
    assert store.get_run_history(step_id) == []
    writer.flush(publisher)
    due_now(worker)
    writer.flush(worker)
    assert depth(worker) == (0, 0)
    [attempt] = store.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count) == ("running", 1)


def test_an_event_past_its_grace_that_still_finds_no_step_is_set_aside(
    store: WorkflowStore, tmp_path: Path
) -> None:
    """``overdue``: a success whose step nobody publishes waits its grace, then is set
    aside (kept for a replay), never in the way."""
    for grace, after in ((GRACE, (1, 0)), (NO_GRACE, (0, 1))):
        writer = Writer(store, tmp_path / f"grace-{grace}", grace=grace)
        try:
            worker = writer.journal()
            step_id = str(uuid.uuid4())
            append(worker, succeeded(step_id, step_id))
            writer.flush(worker)
            assert depth(worker) == (1, 0)  # it waits first, whatever its grace
            due_now(worker)
            writer.flush(worker)
            assert depth(worker) == after
            assert store.get_run_history(step_id) == []
        finally:
            writer.close()


def test_a_step_nobody_published_is_adopted_at_once(store: WorkflowStore, writer: Writer) -> None:
    """``adopts``: its message came from a process without pikku-celery."""
    worker = writer.journal()
    run_id, step_id = chain(store), str(uuid.uuid4())
    append(worker, started(step_id, adoption=adoption_of(run_id, published=False)))
    writer.flush(worker)
    assert depth(worker) == (0, 0)
    assert steps(store, run_id) == {"add": "running"}
    assert store.get_step_state(run_id, "add").data == {"args": [3], "kwargs": {}}


def test_a_step_whose_publisher_journaled_it_is_adopted_only_once_overdue(
    store: WorkflowStore, impatient: Writer
) -> None:
    """``adopts``: its start waits for the publish; past its grace, it is recorded alone."""
    worker = impatient.journal()
    run_id, step_id = chain(store), str(uuid.uuid4())
    append(worker, started(step_id, adoption=adoption_of(run_id, published=True)))
    impatient.flush(worker)
    assert depth(worker) == (1, 0)
    assert steps(store, run_id) == {}
    due_now(worker)
    impatient.flush(worker)
    assert depth(worker) == (0, 0)
    assert steps(store, run_id) == {"add": "running"}


def test_a_new_step_waits_for_the_step_it_follows_then_goes_without_the_link(
    store: WorkflowStore, impatient: Writer
) -> None:
    """``parent_link``: the store writes a link after the one it follows; once the link is
    overdue (the one before never came), it is recorded on its own."""
    worker = impatient.journal()
    run_id, first, second = chain(store), str(uuid.uuid4()), str(uuid.uuid4())
    append(worker, link(run_id, second, first))
    impatient.flush(worker)
    assert depth(worker) == (1, 0)
    assert steps(store, run_id) == {}
    due_now(worker)
    impatient.flush(worker)
    assert depth(worker) == (0, 0)
    [step] = store.list_step_states(run_id)
    assert (step.step_id, step.status, step.from_step_name) == (second, "scheduled", None)


# --- what the store keeps inside a batch's transaction -------------------------------------


def test_a_new_step_is_written_after_the_step_it_follows(
    store: WorkflowStore, writer: Writer
) -> None:
    """The store's ``_place_steps``: the link waits, then lands linked to the one before."""
    publisher, worker = writer.journal(), writer.journal()
    run_id, first, second = chain(store), str(uuid.uuid4()), str(uuid.uuid4())
    append(publisher, link(run_id, first))
    append(worker, link(run_id, second, first))
    writer.flush(worker)
    assert (depth(worker), steps(store, run_id)) == ((1, 0), {})
    writer.flush(publisher)
    due_now(worker)
    writer.flush(worker)
    assert depth(worker) == (0, 0)
    follows = {s.step_id: s.from_step_name for s in store.list_step_states(run_id)}
    assert follows == {first: None, second: "add"}


def test_a_new_step_is_written_after_its_run(store: WorkflowStore, writer: Writer) -> None:
    """The store's ``_place_steps``: a step of a run another process makes waits for it."""
    publisher, worker = writer.journal(), writer.journal()
    run_id, step_id = str(uuid.uuid4()), str(uuid.uuid4())
    append(publisher, lone(run_id))
    append(worker, link(run_id, step_id))
    writer.flush(worker)
    assert depth(worker) == (1, 0)
    writer.flush(publisher)
    due_now(worker)
    writer.flush(worker)
    assert depth(worker) == (0, 0)
    assert steps(store, run_id) == {"charge": "scheduled", "add": "scheduled"}


def test_a_result_waits_with_its_attempt_in_one_batch(store: WorkflowStore, writer: Writer) -> None:
    """The store's ``_apply``: a result of a step the batch misses is not written, so a
    reader never sees SUCCESS before SQL shows the attempt succeeded."""
    publisher, worker = writer.journal(), writer.journal()
    step_id = str(uuid.uuid4())
    append(publisher, lone(step_id))
    append(worker, started(step_id), succeeded(step_id, step_id), result_stored(step_id))
    writer.flush(worker)
    assert depth(worker) == (3, 0)
    assert store.results.get(step_id) is None
    writer.flush(publisher)
    due_now(worker)
    writer.flush(worker)
    assert store.get_step_state(step_id, "charge").status == "succeeded"
    stored = store.results.get(step_id)
    assert stored is not None and stored.status == "SUCCESS"


def test_a_run_stays_open_while_its_next_link_waits_in_the_same_batch(
    store: WorkflowStore, writer: Writer
) -> None:
    """The store's ``_apply``: Celery publishes a chain's next link before the success of the
    link that sends it; when that link waits, the success does not complete the run."""
    publisher, worker = writer.journal(), writer.journal()
    run_id, first, second, elsewhere = chain(store), *(str(uuid.uuid4()) for _ in range(3))
    append(publisher, link(run_id, first))
    writer.flush(publisher)
    # The next link follows a step whose publish has not landed (another process's).
    append(worker, started(first), link(run_id, second, elsewhere), succeeded(first, run_id))
    writer.flush(worker)
    assert depth(worker) == (1, 0)
    assert steps(store, run_id) == {"add": "succeeded"}
    assert store.get_run(run_id).status == "running"


# --- within one journal: what waits holds those behind it --------------------------------


def test_a_steps_later_events_wait_behind_its_start_that_waits(
    store: WorkflowStore, writer: Writer
) -> None:
    """``Holds.behind_its_step``: a message delivered again; its first start waits for the
    publish, and the second start and the success, due first, wait behind it: the attempt
    is never succeeded with one delivery counted of two."""
    publisher, worker = writer.journal(), writer.journal()
    step_id = str(uuid.uuid4())
    append(publisher, lone(step_id))
    append(worker, started(step_id, pid=1))
    writer.flush(worker)
    append(worker, started(step_id, pid=2), succeeded(step_id, step_id))
    writer.flush(publisher)
    writer.flush(worker)  # the first start is not due: the two behind it wait
    assert depth(worker) == (3, 0)
    [attempt] = store.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count) == ("scheduled", 0)
    due_now(worker)
    writer.flush(worker)
    assert depth(worker) == (0, 0)
    [attempt] = store.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count) == ("succeeded", 2)


def test_an_event_waits_behind_every_earlier_event_of_its_step_that_waits(
    store: WorkflowStore, writer: Writer
) -> None:
    """``Holds.behind_its_step``: two starts deferred at two flushes come due apart; the
    first written does not let the success overtake the second."""
    publisher, worker = writer.journal(), writer.journal()
    step_id = str(uuid.uuid4())
    append(publisher, lone(step_id))
    append(worker, started(step_id, pid=1))
    writer.flush(worker)
    append(worker, started(step_id, pid=2))
    writer.flush(worker)  # behind the first
    append(worker, succeeded(step_id, step_id))
    writer.flush(publisher)
    [first, *_] = worker.peek(BATCH_SIZE, math.inf)
    worker.defer([first.seq], 0.0, 0.0)  # the first start alone is due again
    writer.flush(worker)
    assert depth(worker) == (2, 0)
    [attempt] = store.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count) == ("running", 1)
    due_now(worker)
    writer.flush(worker)
    [attempt] = store.get_run_history(step_id)
    assert (attempt.status, attempt.delivery_count) == ("succeeded", 2)


def test_a_result_waits_behind_its_attempts_end_that_waits(
    store: WorkflowStore, writer: Writer
) -> None:
    """``Holds.behind_its_step``: the attempt's end waits for the step; the result, flushed
    later on its own once the step is there, waits behind it."""
    publisher, worker = writer.journal(), writer.journal()
    step_id = str(uuid.uuid4())
    append(publisher, lone(step_id))
    append(worker, started(step_id), succeeded(step_id, step_id))
    writer.flush(worker)
    writer.flush(publisher)
    append(worker, result_stored(step_id))
    writer.flush(worker)  # the result is due, its attempt's end is not
    assert depth(worker) == (3, 0)
    assert store.results.get(step_id) is None
    due_now(worker)
    writer.flush(worker)
    assert store.get_step_state(step_id, "charge").status == "succeeded"
    stored = store.results.get(step_id)
    assert stored is not None and stored.status == "SUCCESS"


def test_a_steps_success_waits_for_a_publish_of_its_run_that_waits(
    store: WorkflowStore, writer: Writer
) -> None:
    """``Holds.behind_a_publish_of_its_run``: the chain's next link waits for its sender's
    publish; the sender's success and the link's start come due before the link's publish.
    The success waits for that publish itself: else the run completes without the link."""
    publisher, worker = writer.journal(), writer.journal()
    run_id, first, second = chain(store), str(uuid.uuid4()), str(uuid.uuid4())
    append(publisher, link(run_id, first))
    append(worker, link(run_id, second, first))
    writer.flush(worker)  # the link waits for its sender's publish
    adoption = adoption_of(run_id, published=True)
    append(worker, succeeded(first, run_id), started(second, adoption=adoption))
    writer.flush(publisher)
    writer.flush(worker)  # the link's publish is not due: the success waits for it
    the_success_waits_for_the_link(store, writer, worker, run_id, before={"add": "scheduled"})


def test_a_publish_that_waits_in_a_batch_holds_back_the_success_behind_it(
    store: WorkflowStore, writer: Writer
) -> None:
    """``Holds.behind``: in a pool of threads (one journal), the next link's start can be
    journaled before its publish. The publish waits behind that start; the success behind
    the publish, in the same batch, waits for it too, so the run does not complete."""
    publisher, worker = writer.journal(), writer.journal()
    run_id, first, second = chain(store), str(uuid.uuid4()), str(uuid.uuid4())
    append(publisher, link(run_id, first))
    writer.flush(publisher)
    append(worker, started(first), started(second, adoption=adoption_of(run_id, published=True)))
    writer.flush(worker)  # the link's start waits for its publish
    append(worker, link(run_id, second, first), succeeded(first, run_id))
    writer.flush(worker)
    the_success_waits_for_the_link(store, writer, worker, run_id, before={"add": "running"})


def test_a_batch_split_around_a_poison_event_keeps_the_order_of_its_halves(
    store: WorkflowStore, writer: Writer
) -> None:
    """``Holds.behind_a_publish_of_its_run`` across the halves: the next link, waiting in
    the first half, holds back the success in the second, written in its own transaction."""
    publisher, worker = writer.journal(), writer.journal()
    run_id, first, second, elsewhere = chain(store), *(str(uuid.uuid4()) for _ in range(3))
    append(publisher, link(run_id, first))
    writer.flush(publisher)
    poison = AttemptEnded(
        id=new_event_id(),
        at=time.time(),
        step_id=str(uuid.uuid4()),
        attempt=1,
        run_id=None,
        status="exploded",  # no attempt can have it: the batch fails and is split
        error_json="{}",
    )
    append(worker, link(run_id, second, elsewhere), poison, succeeded(first, run_id))
    writer.flush(worker)
    assert depth(worker) == (2, 1)
    assert steps(store, run_id) == {"add": "scheduled"}
    assert store.get_run(run_id).status == "running"


def test_an_event_set_aside_holds_nothing_behind_it(
    store: WorkflowStore, impatient: Writer
) -> None:
    """``Holds.left``: a start that waited past its grace is set aside; the success behind
    it, which waits for its step too, is written once the step is there."""
    publisher, worker = impatient.journal(), impatient.journal()
    step_id = str(uuid.uuid4())
    append(worker, started(step_id))
    impatient.flush(worker)  # it waits, and holds its step's events behind it
    append(worker, succeeded(step_id, step_id))
    due_now(worker)
    impatient.flush(worker)  # overdue now, the start is set aside; the success waits
    assert depth(worker) == (1, 1)
    append(publisher, lone(step_id))
    impatient.flush(publisher)
    due_now(worker)
    impatient.flush(worker)
    assert depth(worker) == (0, 1)
    [attempt] = store.get_run_history(step_id)
    assert attempt.status == "succeeded"
