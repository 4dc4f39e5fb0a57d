"""A chord kept by the result backend fires exactly once: when the batches that write its
last parts commit at the same time, one of them claims it; a part written again (a
duplicate delivery) never fires it twice; expiry takes chords with results."""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.schema import celery_result_chord_parts, celery_results
from pikku_celery.store import ChordWrite, FiredChord, MirrorBatch, ResultWrite, now
from tests.conftest import truncate


def success(task_id: str) -> ResultWrite:
    return ResultWrite(task_id, 1, "SUCCESS", f'{{"result": "{task_id}"}}'.encode(), now())


def write(store: WorkflowStore, *rows: ResultWrite) -> list[FiredChord]:
    return list(store.batches.apply_batch(MirrorBatch(results=list(rows))).fired)


def write_when_both_are_ready(
    store: WorkflowStore, task_id: str, start: threading.Barrier, fired: list[FiredChord]
) -> None:
    start.wait()
    fired.extend(write(store, success(task_id)))


def test_the_last_part_fires_the_chord_once_with_its_parts_in_header_order(
    store: WorkflowStore,
) -> None:
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(3)]
    store.results.apply_chord(group_id, parts, b"body")
    store.results.apply_chord(group_id, parts, b"body")  # applied again: still one chord

    assert write(store, success(parts[2])) == []
    assert write(store, success(parts[0]), success(parts[2])) == []  # a duplicate of 2
    [fired] = write(store, success(parts[1]))
    assert fired == FiredChord(group_id, b"body", tuple(parts))
    assert write(store, success(parts[1])) == []  # delivered again: fired already


def test_batches_that_write_the_last_parts_at_once_fire_the_chord_once(
    store: WorkflowStore,
) -> None:
    for _ in range(20):
        group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(2)]
        store.results.apply_chord(group_id, parts, b"body")
        fired: list[FiredChord] = []
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=write_when_both_are_ready, args=(store, part, start, fired))
            for part in parts
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert [chord.group_id for chord in fired] == [group_id]


def test_chords_expire_with_their_results(store: WorkflowStore) -> None:
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4())]
    store.results.apply_chord(group_id, parts, b"body")
    assert store.results.expire(now() + dt.timedelta(seconds=1)) >= 1
    assert write(store, success(parts[0])) == []  # its chord is gone: nothing fires


def journaled(group_id: str, parts: list[str], at: dt.datetime | None = None) -> MirrorBatch:
    """The batch of a publisher's journal holding the chord it applied."""
    return MirrorBatch(chords=[ChordWrite(group_id, tuple(parts), b"body", at or now())])


def test_a_journaled_chord_that_lands_after_its_parts_fires_as_it_lands(
    store: WorkflowStore,
) -> None:
    # The publisher's journal and the workers' are flushed apart: the header's results
    # may all be in SQL before the chord is.
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(2)]
    assert write(store, success(parts[1]), success(parts[0])) == []
    applied = journaled(group_id, parts)
    [fired] = store.batches.apply_batch(applied).fired
    assert fired == FiredChord(group_id, b"body", tuple(parts))
    assert list(store.batches.apply_batch(applied).fired) == []  # replayed: fired once

    other, halves = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(2)]
    assert list(store.batches.apply_batch(journaled(other, halves)).fired) == []
    assert write(store, success(halves[0])) == []
    assert [c.group_id for c in write(store, success(halves[1]))] == [other]


def test_the_reaper_finds_a_chord_no_batch_fired_and_a_body_never_said_sent(
    store: WorkflowStore,
) -> None:
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4())]
    long_ago = now() - dt.timedelta(minutes=5)
    # As when the chord and its last result land at once in two transactions, each
    # counting before the other committed: both in SQL, not fired.
    store.batches.apply_batch(journaled(group_id, parts, long_ago))
    store.results.mark_sent([])  # nothing to mark: no statement, no error
    with store.engine.begin() as conn:
        row = {"task_id": parts[0], "status": "SUCCESS", "attempt": 1, "meta": b"{}"}
        conn.execute(sa.insert(celery_results).values(**row, updated_at=long_ago))
    assert store.results.finish_due_chords(now() - dt.timedelta(minutes=10)) == []  # too new
    [fired] = store.results.finish_due_chords(now())
    assert fired.group_id == group_id
    assert store.results.finish_due_chords(now()) == []  # claimed once

    # Claimed and never said sent: the reaper's look finds it once the grace has passed.
    assert store.results.unsent_chords(now() - dt.timedelta(seconds=30)) == []
    [unsent] = store.results.unsent_chords(now() + dt.timedelta(seconds=1))
    assert unsent == FiredChord(group_id, b"body", tuple(parts))
    store.batches.apply_batch(MirrorBatch(chords_sent=[(group_id, now())]))
    assert store.results.unsent_chords(now() + dt.timedelta(seconds=1)) == []


def test_a_task_added_to_a_chord_is_waited_for_after_the_others_and_counted_once(
    store: WorkflowStore,
) -> None:
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(2)]
    added = str(uuid.uuid4())
    store.results.apply_chord(group_id, parts, b"body")
    # As Task.add_to_chord journals it, before the adding task's own result.
    batch = MirrorBatch(chord_parts=[(group_id, added)], results=[success(parts[0])])
    assert list(store.batches.apply_batch(batch).fired) == []
    store.batches.apply_batch(MirrorBatch(chord_parts=[(group_id, added)]))  # again: once
    assert write(store, success(parts[1])) == []  # the added task is still out
    [fired] = write(store, success(added))
    assert fired == FiredChord(group_id, b"body", (*parts, added))


class _HeldCommits:
    """Holds each of ``parties`` transactions of an engine just before its COMMIT until all
    of them got there: every statement of each ran while none had committed."""

    def __init__(self, engine: sa.Engine, parties: int) -> None:
        self._engine = engine
        self._barrier = threading.Barrier(parties, timeout=30)
        self._holding = threading.local()

    def __enter__(self) -> _HeldCommits:
        sa.event.listen(self._engine, "commit", self._hold)
        return self

    def __exit__(self, *exc: object) -> None:
        sa.event.remove(self._engine, "commit", self._hold)

    def hold_this_thread(self) -> None:
        self._holding.on = True

    def _hold(self, conn: sa.Connection) -> None:
        if getattr(self._holding, "on", False):
            self._holding.on = False  # the first COMMIT of the thread only
            self._barrier.wait()


def _apply_held(
    store: WorkflowStore, commits: _HeldCommits, batch: MirrorBatch, fired: list[FiredChord]
) -> None:
    commits.hold_this_thread()
    fired.extend(store.batches.apply_batch(batch).fired)


def test_a_chord_and_its_last_result_committed_at_once_fire_the_chord_once(
    pg_engine: sa.Engine,
) -> None:
    # The publisher's flusher writes the chord, a worker's writes the header's last result;
    # each counts before the other committed. The chord fires anyway, as they commit,
    # not at the reaper's next pass (which may be off).
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    for chord_first in (True, False, True, False):
        group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(2)]
        assert write(store, success(parts[0])) == []
        fired: list[FiredChord] = []
        with _HeldCommits(pg_engine, 2) as commits:
            batches = [journaled(group_id, parts), MirrorBatch(results=[success(parts[1])])]
            threads = [
                threading.Thread(target=_apply_held, args=(store, commits, batch, fired))
                for batch in (batches if chord_first else batches[::-1])
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        assert [chord.group_id for chord in fired] == [group_id]
        assert fired[0].parts == tuple(parts)


def test_a_fired_chord_applied_again_later_fires_again_and_once(store: WorkflowStore) -> None:
    # A frozen chord applied twice: the same group id and parts, a new run each time.
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4())]
    first = journaled(group_id, parts, now() - dt.timedelta(seconds=1))
    assert list(store.batches.apply_batch(first).fired) == []
    assert [c.group_id for c in write(store, success(parts[0]))] == [group_id]
    assert list(store.batches.apply_batch(first).fired) == []  # the first apply, replayed
    again = journaled(group_id, parts)
    [fired] = store.batches.apply_batch(again).fired
    assert fired == FiredChord(group_id, b"body", tuple(parts))
    assert list(store.batches.apply_batch(again).fired) == []
    assert store.results.unsent_chords(now() + dt.timedelta(seconds=1))[0].group_id == group_id


def test_a_task_added_before_its_chord_is_in_sql_is_waited_for_after_the_header(
    store: WorkflowStore,
) -> None:
    # The adding task's journal (its add, then its own result) is flushed by a worker
    # before the publisher's journal brings the chord.
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(2)]
    added = str(uuid.uuid4())
    adding = MirrorBatch(chord_parts=[(group_id, added)], results=[success(parts[0])])
    assert list(store.batches.apply_batch(adding).fired) == []
    assert write(store, success(parts[1])) == []
    assert list(store.batches.apply_batch(journaled(group_id, parts)).fired) == []
    [fired] = write(store, success(added))
    assert fired == FiredChord(group_id, b"body", (*parts, added))


def _done_flags(engine: sa.Engine, group_id: str) -> dict[str, bool]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(celery_result_chord_parts.c.task_id, celery_result_chord_parts.c.done).where(
                celery_result_chord_parts.c.group_id == group_id
            )
        ).all()
    return {task_id: bool(done) for task_id, done in rows}


def test_a_part_is_done_once_its_result_is_in_whichever_landed_first(
    store: WorkflowStore,
) -> None:
    # The chord is counted by its own rows: each part says whether its result is in, set by
    # the result's batch, or by the chord's when the result came first.
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(3)]
    assert write(store, success(parts[0])) == []
    assert list(store.batches.apply_batch(journaled(group_id, parts)).fired) == []
    assert _done_flags(store.engine, group_id) == {parts[0]: True, parts[1]: False, parts[2]: False}
    assert write(store, success(parts[2]), success(parts[2])) == []
    assert _done_flags(store.engine, group_id)[parts[2]]
    [fired] = write(store, success(parts[1]))
    assert fired == FiredChord(group_id, b"body", tuple(parts))
    assert set(_done_flags(store.engine, group_id).values()) == {True}


def test_the_reaper_goes_on_past_chords_that_wait_long(store: WorkflowStore) -> None:
    # Two chords the reaper looks at one at a time: the first waits for a task that never
    # ends; the second, whose result the batches never counted, fires at the next look.
    long_ago = now() - dt.timedelta(minutes=5)
    waiting, due = sorted(str(uuid.uuid4()) for _ in range(2))
    waiting_part, due_part = str(uuid.uuid4()), str(uuid.uuid4())
    store.batches.apply_batch(journaled(waiting, [waiting_part], long_ago))
    store.batches.apply_batch(journaled(due, [due_part], long_ago))
    with store.engine.begin() as conn:
        row = {"task_id": due_part, "status": "SUCCESS", "attempt": 1, "meta": b"{}"}
        conn.execute(sa.insert(celery_results).values(**row, updated_at=long_ago))
    assert store.results.finish_due_chords(now(), limit=1) == []  # the waiting one
    [fired] = store.results.finish_due_chords(now(), limit=1)
    assert fired.group_id == due
    assert store.results.finish_due_chords(now(), limit=1) == []


def test_an_added_part_and_its_chord_committed_at_once_fire_the_chord_once(
    pg_engine: sa.Engine,
) -> None:
    # The added task's part row is in before its chord; its result (marked on that row) and
    # the chord land in two transactions at once, each blind to the other's row.
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    for chord_first in (True, False, True, False):
        group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4())]
        added = str(uuid.uuid4())
        store.batches.apply_batch(MirrorBatch(chord_parts=[(group_id, added)]))
        assert write(store, success(parts[0])) == []
        fired: list[FiredChord] = []
        with _HeldCommits(pg_engine, 2) as commits:
            batches = [journaled(group_id, parts), MirrorBatch(results=[success(added)])]
            threads = [
                threading.Thread(target=_apply_held, args=(store, commits, batch, fired))
                for batch in (batches if chord_first else batches[::-1])
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        assert [chord.group_id for chord in fired] == [group_id]
        assert fired[0].parts == (*parts, added)


def test_the_look_after_a_commit_fires_no_chord_on_a_result_the_batch_held_back(
    pg_engine: sa.Engine,
) -> None:
    # A batch names the ready results it was given, written or not (one whose step is not
    # in SQL yet waits with it): the look after its COMMIT fires a chord only on results
    # that are in SQL, then fires it once the held one is written.
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(2)]
    store.results.apply_chord(group_id, parts, b"body")
    assert write(store, success(parts[0])) == []
    assert store.results.settle([], [parts[1]]) == []
    assert store.results.settle([group_id], [parts[1]]) == []
    [fired] = write(store, success(parts[1]))
    assert fired == FiredChord(group_id, b"body", tuple(parts))


def test_a_part_written_at_once_with_its_chord_counts_for_the_last_part(
    pg_engine: sa.Engine,
) -> None:
    # A header task's result and its chord land at once, each transaction blind to the
    # other's row; the chord is not done yet. The part still counts: the batch of the last
    # part fires the chord itself, not the reaper's pass seconds later.
    truncate(pg_engine)
    store = WorkflowStore(pg_engine)
    for chord_first in (True, False, True, False):
        group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(3)]
        fired: list[FiredChord] = []
        with _HeldCommits(pg_engine, 2) as commits:
            batches = [journaled(group_id, parts), MirrorBatch(results=[success(parts[0])])]
            threads = [
                threading.Thread(target=_apply_held, args=(store, commits, batch, fired))
                for batch in (batches if chord_first else batches[::-1])
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        assert fired == []
        assert write(store, success(parts[1])) == []
        assert [chord.group_id for chord in write(store, success(parts[2]))] == [group_id]
