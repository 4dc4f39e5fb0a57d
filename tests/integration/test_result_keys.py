"""The result backend's statements and the leases', as PostgreSQL receives them, stay in
the shapes a sharded store plans: results keyed by task id, a chord and its parts by
group id and never joined to the results, and ON CONFLICT parts that call no clock and,
in an INSERT ... SELECT, bind no parameter."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.store import ChordWrite, MirrorBatch, ResultWrite, now
from tests.conftest import truncate

_CLOCK = re.compile(r"\b(clock_timestamp|statement_timestamp|now|current_timestamp)\b", re.I)
_PLACEHOLDER = re.compile(r"%\(\w+\)s|%s|\$\d+")
_INSERT_SELECT = re.compile(r"^\s*(WITH\b.*)?INSERT INTO \S+ \([^)]*\)\s*SELECT\b", re.I | re.S)


@pytest.fixture
def sent(pg_engine: sa.Engine) -> Iterator[list[str]]:
    truncate(pg_engine)
    statements: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    sa.event.listen(pg_engine, "before_cursor_execute", record)
    yield statements
    sa.event.remove(pg_engine, "before_cursor_execute", record)


def _result(task_id: str, attempt: int | None = 1, status: str = "SUCCESS") -> ResultWrite:
    return ResultWrite(task_id, attempt, status, b"{}", now())


def _a_chords_life(store: WorkflowStore) -> None:
    group_id, parts = str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(4)]
    added = str(uuid.uuid4())
    store.batches.apply_batch(MirrorBatch(results=[_result(parts[0])]))  # before its chord
    chord = ChordWrite(group_id, tuple(parts), b"body", now())
    store.batches.apply_batch(MirrorBatch(chords=[chord]))
    store.batches.apply_batch(MirrorBatch(chord_parts=[(group_id, added)]))
    fired = list(store.batches.apply_batch(MirrorBatch(results=[_result(p) for p in parts])).fired)
    fired += store.batches.apply_batch(MirrorBatch(results=[_result(added)])).fired
    store.results.finish_due_chords(now())
    store.batches.apply_batch(MirrorBatch(chords_sent=[(group_id, now())]))
    assert [c.group_id for c in fired] == [group_id]


def test_no_statement_of_a_chords_life_joins_its_parts_to_the_results(
    pg_engine: sa.Engine, sent: list[str]
) -> None:
    _a_chords_life(WorkflowStore(pg_engine))
    assert any("pikku_celery_result_chord_parts" in s for s in sent)
    both = [s for s in sent if "pikku_celery_results" in s and "chord_parts" in s]
    assert both == []


def test_on_conflict_parts_call_no_clock_and_an_insert_select_binds_none_there(
    pg_engine: sa.Engine, sent: list[str]
) -> None:
    store = WorkflowStore(pg_engine)
    _a_chords_life(store)
    task_id = str(uuid.uuid4())
    store.results.write([_result(task_id, None, "REVOKED")])  # no attempt named
    store.results.write([_result(task_id, 2, "STARTED")])
    store.results.save_group(str(uuid.uuid4()), b"[]")
    generation = store.leases.take_lease("pass", "a", ttl=30)
    assert generation is not None
    assert store.leases.release_lease("pass", "a", generation)
    assert store.leases.take_lease("pass", "b", ttl=30, over_resting=True) == generation + 1

    upserts = [s for s in sent if "ON CONFLICT" in s and "DO UPDATE" in s]
    tables = {re.search(r"INSERT INTO (\S+)", s).group(1) for s in upserts}  # type: ignore[union-attr]
    assert {"pikku_celery_results", "pikku_celery_groups", "pikku_celery_leases"} <= tables
    for statement in upserts:
        on_conflict = statement[statement.index("ON CONFLICT") :]
        assert not _CLOCK.search(on_conflict), statement
        if _INSERT_SELECT.match(statement):
            assert not _PLACEHOLDER.search(on_conflict), statement
