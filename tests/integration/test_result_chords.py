"""A chord kept by the result backend fires exactly once: when the batches that write its
last parts commit at the same time, one of them claims it; a part written again (a
duplicate delivery) never fires it twice; expiry takes chords with results."""

from __future__ import annotations

import datetime as dt
import threading
import uuid

from pikku_celery import WorkflowStore
from pikku_celery.store import FiredChord, MirrorBatch, ResultWrite, now


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
