"""A batch committed in pieces, one transaction per group of keys (as on Citus, one per
shard group), that fails after a piece committed and is applied again whole ends with the
rows a batch committed at once leaves: the same runs, steps, attempts, delivery counts and
results, and its chord fired once.

The groups are the test's own (each key placed by hand); the failure is the database's
own error, raised by the driver at the first statement after the chosen COMMIT.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.errors import RunNotFound, StoreUnavailable
from pikku_celery.mirror import Recorder, result_stored
from pikku_celery.mirror.events import chord_applied
from pikku_celery.store import (
    ChordWrite,
    FiredChord,
    MirrorBatch,
    NewStep,
    PartlyWritten,
    ResultWrite,
    RunOutcome,
    StepTransition,
    now,
)
from tests.conftest import PgServer
from tests.support.published import lone
from tests.support.published import lone_step as published_lone_step

T0 = dt.datetime(2026, 12, 5, 9, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


class Placed:
    """Each key in the group the test gave it; any other key in group 0."""

    def __init__(self, groups: Mapping[str, int]) -> None:
        self.groups = dict(groups)
        self.calls = 0

    def __call__(self, keys: Collection[str]) -> Mapping[str, int]:
        self.calls += 1
        return {key: self.groups.get(key, 0) for key in keys}


@contextmanager
def failing_after(store: WorkflowStore, commits: int) -> Iterator[list[int]]:
    """The driver fails the first statement after the ``commits``-th COMMIT (once)."""
    seen = [0, 0]  # commits, failures

    def committed(conn: Any) -> None:
        seen[0] += 1

    def execute(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if seen[0] == commits and not seen[1]:
            seen[1] += 1
            # Wrapped as SQLAlchemy wraps the driver's own errors (not every version wraps
            # one raised by a listener).
            lost = conn.dialect.loaded_dbapi.OperationalError("the server closed the connection")
            raise sa.exc.OperationalError(statement, parameters, lost)

    sa.event.listen(store.engine, "commit", committed)
    sa.event.listen(store.engine, "before_cursor_execute", execute)
    try:
        yield seen
    finally:
        sa.event.remove(store.engine, "commit", committed)
        sa.event.remove(store.engine, "before_cursor_execute", execute)


def lone_step(run_id: str, name: str) -> NewStep:
    return published_lone_step(run_id, at(0), name)


def success(task_id: str, attempt: int = 1) -> ResultWrite:
    meta = f'{{"status": "SUCCESS", "result": "{task_id}"}}'.encode()
    return ResultWrite(task_id, attempt, "SUCCESS", meta, at(3), date_done=at(3))


def ended(step_id: str, attempt: int, delivery: str) -> StepTransition:
    return StepTransition(
        step_id=step_id,
        attempt=attempt,
        status="succeeded",
        at=at(3),
        running_at=at(2),
        ended_at=at(3),
        result_json=f'"{step_id}"',
        task_id=step_id,
        worker="w1",
        pid=7,
        reason="first" if attempt == 1 else "retry",
        delivery_ids=(delivery,),
    )


class Workload:
    """Runs spread over three groups: lone tasks (one retried), a chord whose two parts
    are in two groups, and a run of two steps whose second step's result is keyed apart
    from its run."""

    def __init__(self) -> None:
        ids = [str(uuid.uuid4()) for _ in range(5)]
        self.retried, self.part_a, self.part_b, self.plain, self.canvas = ids
        self.link = str(uuid.uuid4())  # the canvas run's second step, a task of its own
        self.group_id = str(uuid.uuid4())
        self.groups = {
            self.retried: 0,
            self.group_id: 0,
            self.part_a: 0,
            self.part_b: 1,
            self.plain: 2,
            self.canvas: 1,
            self.link: 2,  # its result's key: written after its run's piece
        }

    def setup(self) -> MirrorBatch:
        """What an earlier batch committed: the canvas run's first step."""
        return MirrorBatch(steps=[lone_step(self.canvas, "order")])

    def batch(self) -> MirrorBatch:
        error = '{"type": "ValueError", "message": "try again", "traceback": null}'
        lone = [self.retried, self.part_a, self.part_b, self.plain]
        link = NewStep(
            run_id=self.canvas,
            step_id=self.link,
            step_name="ship",
            rpc_name="shop.ship",
            data_json="[2]",
            at=at(1),
            parent_step_id=self.canvas,
        )
        transitions = [ended(step_id, 1, f"d-{step_id}") for step_id in lone[1:]]
        transitions += [
            StepTransition(
                step_id=self.retried,
                attempt=1,
                status="failed",
                at=at(1),
                running_at=at(0.5),
                ended_at=at(1),
                error_json=error,
                task_id=self.retried,
                reason="first",
                delivery_ids=(f"d1-{self.retried}",),
            ),
            ended(self.retried, 2, f"d2-{self.retried}"),
            ended(self.canvas, 1, f"d-{self.canvas}"),
            ended(self.link, 1, f"d-{self.link}"),
        ]
        outcomes = [RunOutcome(step_id, step_id, "complete", at(3)) for step_id in lone]
        outcomes.append(RunOutcome(self.link, self.canvas, "complete", at(3)))
        results = [success(self.retried, 2), *(success(s) for s in lone[1:])]
        results.append(success(self.link))
        chord = ChordWrite(self.group_id, (self.part_a, self.part_b), b"body", at(0))
        return MirrorBatch(
            steps=[lone_step(step_id, "charge") for step_id in lone] + [link],
            transitions=transitions,
            outcomes=outcomes,
            results=results,
            chords=[chord],
        )


def rows(store: WorkflowStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every row the batch touches, less what each transaction makes anew (attempt row
    ids, the moment a chord was claimed)."""
    queries = {
        "runs": "SELECT workflow_run_id, workflow, status, input, output, error, wire, "
        "created_at, updated_at FROM workflow_runs",
        "steps": "SELECT workflow_run_id, workflow_step_id, step_name, status, result, error, "
        "current_attempt, created_at, updated_at FROM workflow_step",
        "attempts": "SELECT workflow_run_id, workflow_step_id, attempt, status, result, error, "
        "running_at, scheduled_at, succeeded_at, failed_at, task_id, worker, pid, "
        "delivery_count, reason FROM workflow_step_history",
        "deliveries": "SELECT workflow_run_id, event_id FROM pikku_celery_deliveries",
        "results": "SELECT task_id, status, attempt, meta, date_done FROM pikku_celery_results",
        "chords": "SELECT group_id, size, fired_at IS NOT NULL, sent_at "
        "FROM pikku_celery_result_chords",
        "parts": "SELECT group_id, task_id, position, done FROM pikku_celery_result_chord_parts",
    }
    with store.engine.connect() as conn:
        return {
            name: sorted(
                (tuple(bytes(v) if isinstance(v, memoryview) else v for v in row))
                for row in conn.exec_driver_sql(query).all()
            )
            for name, query in queries.items()
        }


@pytest.fixture(params=["postgresql", "sqlite"])
def two_stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[WorkflowStore, WorkflowStore]]:
    """A store whose batches are cut in pieces, and one whose batches commit at once."""
    stores = []
    for name in ("split", "whole"):
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / name}.db"
        else:
            server: PgServer = request.getfixturevalue("pg_server")
            url = server.create_database(f"pikku_{name}")
        store = WorkflowStore(url)
        store.init()
        stores.append(store)
    try:
        yield stores[0], stores[1]
    finally:
        for store in stores:
            store.close()


def fired_ids(fired: Collection[FiredChord]) -> list[str]:
    return [chord.group_id for chord in fired]


@pytest.mark.parametrize("commits", [1, 2, 3], ids=lambda n: f"fails-after-piece-{n}")
def test_a_batch_that_failed_after_a_piece_committed_applies_again_to_the_same_rows(
    two_stores: tuple[WorkflowStore, WorkflowStore], commits: int
) -> None:
    split, whole = two_stores
    work = Workload()
    for store in (split, whole):
        store.batches.apply_batch(work.setup())
    placed = Placed(work.groups)
    split.db.split_batches_by(placed)

    with failing_after(split, commits) as seen:
        with pytest.raises(PartlyWritten) as partly:
            split.batches.apply_batch(work.batch())
    assert seen == [commits, 1]
    assert isinstance(partly.value.cause, StoreUnavailable)
    # Pieces in group order: the chord fires with its second part, in group 1's piece.
    assert fired_ids(partly.value.written.fired) == ([work.group_id] if commits >= 2 else [])
    assert split.get_run(work.retried).status == "completed"  # group 0 committed
    if commits < 3:
        with pytest.raises(RunNotFound):  # group 2 did not
            split.get_run(work.plain)

    again = split.batches.apply_batch(work.batch())
    once = whole.batches.apply_batch(work.batch())
    assert again.missing == once.missing == frozenset()
    assert fired_ids(partly.value.written.fired) + fired_ids(again.fired) == [work.group_id]
    assert fired_ids(once.fired) == [work.group_id]
    assert placed.calls == 2
    assert rows(split) == rows(whole)
    history = split.get_run_history(work.retried)
    assert [(a.attempt, a.status, a.delivery_count) for a in history] == [
        (1, "failed", 1),
        (2, "succeeded", 1),
    ]
    assert split.get_run(work.canvas).status == "completed"
    stored = split.results.get(work.link)
    assert stored is not None and stored.status == "SUCCESS"


def test_a_result_whose_step_is_missing_waits_with_it_in_another_piece(
    two_stores: tuple[WorkflowStore, WorkflowStore],
) -> None:
    # The link's parent is in no database yet: the link and its end wait, and so does its
    # result, though its key is in another group than the link's run.
    split, _ = two_stores
    work = Workload()
    split.db.split_batches_by(Placed(work.groups))
    result = split.batches.apply_batch(work.batch())
    assert {work.canvas, work.link} <= result.missing
    assert split.results.get(work.link) is None
    assert split.results.get(work.plain) is not None


def test_the_flusher_fires_what_committed_pieces_claimed_and_keeps_every_event(
    pg_server: PgServer, tmp_path: Path
) -> None:
    store = WorkflowStore(pg_server.create_database("pikku_pieces"))
    store.init()
    group_id = str(uuid.uuid4())
    parts = [str(uuid.uuid4()) for _ in range(2)]
    later = [str(uuid.uuid4()) for _ in range(3)]
    store.db.split_batches_by(Placed({group_id: 0, parts[0]: 0, parts[1]: 0}))
    mirror = Recorder(store, journal_dir=tmp_path / "journal", background=False)
    fired: list[str] = []
    mirror.on_chords_fired(lambda chords: fired.extend(c.group_id for c in chords))
    try:
        mirror.append(chord_applied(group_id, parts, b"body"))
        for step_id in parts + later:
            mirror.published(lone(step_id))
            mirror.started(step_id, 1, worker="w", pid=1)
        mirror.flush()
        store.db.split_batches_by(Placed({key: 1 for key in later}))
        for step_id in parts + later:
            mirror.succeeded(step_id, step_id, 1, step_id)
            meta = f'{{"status": "SUCCESS", "result": "{step_id}"}}'.encode()
            mirror.append(result_stored(step_id, 1, "SUCCESS", meta, now()))
        # Group 0's piece (the chord's parts) commits, group 1's fails: the database away.
        with failing_after(store, 1) as seen:
            assert mirror.flush() is False
        assert seen == [1, 1]
        assert fired == [group_id]
        assert store.get_run(later[0]).status == "running"
        assert mirror.flush() is True  # the whole batch again: nothing fires twice
        assert fired == [group_id]
        assert {store.get_run(s).status for s in parts + later} == {"completed"}
        assert len(store.results.get_many(parts + later)) == 5
    finally:
        mirror.close()
        store.close()


def test_prune_on_a_distributed_layout_deletes_one_groups_runs_at_a_time(
    two_stores: tuple[WorkflowStore, WorkflowStore],
) -> None:
    # Locking runs on several shards in one statement is refused by Citus: each group's
    # runs are locked and deleted in a transaction of their own, and the counts add up.
    split, whole = two_stores
    work = Workload()
    for store in (split, whole):
        store.batches.apply_batch(work.setup())
        store.batches.apply_batch(work.batch())
    split.db.split_batches_by(Placed(work.groups))
    later = now() + dt.timedelta(days=1)
    assert split.count_prunable(later) == whole.count_prunable(later)
    pruned, at_once = split.prune(later), whole.prune(later)
    assert pruned == at_once
    assert pruned.runs == 5
    assert rows(split)["runs"] == rows(whole)["runs"] == []


def test_a_chord_body_releases_header_runs_of_other_groups_one_group_at_a_time(
    two_stores: tuple[WorkflowStore, WorkflowStore],
) -> None:
    # Each header task is a run of its own; the first written holds the chord open until
    # its body is written, in the run of the header task that ended last, in another group.
    # That task's end and the body's publish come in one batch: the last run completes in
    # its group's piece, the held one in a transaction of its own group (a distributed
    # database locks rows of one shard per statement).
    split, whole = two_stores
    first, second, body = (str(uuid.uuid4()) for _ in range(3))
    headers = MirrorBatch(
        steps=[
            dataclasses.replace(lone_step(step_id, "add"), chord_body=body)
            for step_id in (first, second)
        ],
        transitions=[ended(first, 1, f"d-{first}")],
        outcomes=[RunOutcome(first, first, "complete", at(3))],
    )
    last = MirrorBatch(
        steps=[
            NewStep(
                run_id=second,
                step_id=body,
                step_name="total",
                rpc_name="shop.total",
                data_json="[]",
                at=at(4),
                parent_step_id=second,
            )
        ],
        transitions=[ended(second, 1, f"d-{second}")],
        outcomes=[RunOutcome(second, second, "complete", at(3))],
    )
    for store in (split, whole):
        store.batches.apply_batch(headers)
        assert store.get_run(first).status == "running"  # held by its chord
    groups = {first: 0, second: 1, body: 1}
    split.db.split_batches_by(Placed(groups))
    locks: list[set[int]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if "FOR NO KEY UPDATE" in statement or "FOR UPDATE" in statement:
            locks.append({groups[v] for v in _strings(parameters) if v in groups})

    sa.event.listen(split.engine, "before_cursor_execute", record)
    try:
        split.batches.apply_batch(last)
    finally:
        sa.event.remove(split.engine, "before_cursor_execute", record)
    whole.batches.apply_batch(last)
    assert split.get_run(first).status == "completed"
    assert rows(split) == rows(whole)
    if split.engine.dialect.name == "postgresql":
        assert locks == [{1}, {0}]


def _strings(parameters: Any) -> Iterator[str]:
    if isinstance(parameters, str):
        yield parameters
    elif isinstance(parameters, dict):
        for value in parameters.values():
            yield from _strings(value)
    elif isinstance(parameters, list | tuple):
        for value in parameters:
            yield from _strings(value)
