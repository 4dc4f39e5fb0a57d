"""Every statement the store sends names the keys of the rows it touches, so a distributed
PostgreSQL (Citus) runs it on the nodes holding those keys, not on all of them.

The workloads (a 500-task drain of lone tasks, a task retried once, a durable workflow with
a child run and a ``send``, a 200-part chord through the result backend, then the upkeep's
scans) run in this process on PostgreSQL; every statement they send is recorded with its
parameters and planned (``EXPLAIN``, nothing runs) against a copy of the schema where each
distributed table is HASH-partitioned into 8 by its key (``schema/distribution.py``), the
way Citus splits it. A statement fails when its plan keeps a partition that none of the
keys it carries falls in, unless ``store/sql/fan_out.py`` names it: ``FAN_OUT`` by design,
``NOT_YET_KEYED`` until the keys reach it (and then it must come off that list).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import PikkuCelery, WorkflowStore
from pikku_celery.mirror import Recorder, result_stored
from pikku_celery.mirror.events import chord_applied, chord_sent
from pikku_celery.schema import metadata
from pikku_celery.schema.distribution import DISTRIBUTED
from pikku_celery.store import now
from pikku_celery.store.sql.fan_out import FAN_OUT, NOT_YET_KEYED
from tests.conftest import PgServer
from tests.support.durable import durable_pikku, settle
from tests.support.published import lone
from tests.support.routing import (
    PARTITIONS,
    Catalogue,
    Execution,
    PartitionedCopy,
    StatementRecorder,
    carried_strings,
    missing_keys,
    unclassified_tables,
)

pytestmark = pytest.mark.postgres

DRAIN = 500
CHORD_PARTS = 200
ERROR = {"type": "ValueError", "message": "try again", "traceback": None}
# Parameter sets planned per statement name: enough to see every shape a workload sends.
PLANNED_PER_NAME = 200


@dataclass
class Verdict:
    """What the plans of one statement's executions kept."""

    executions: int = 0
    # Per table: the most partitions one execution kept, and the keys that one carried.
    widest: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Executions that kept a partition none of their keys falls in.
    beyond_keys: list[str] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)

    @property
    def routes(self) -> bool:
        return not self.beyond_keys and not self.refused


@dataclass
class Routing:
    verdicts: dict[str, Verdict]
    unknown: list[Execution]
    seconds: dict[str, float]
    copy: PartitionedCopy


def _results(mirror: Recorder, task_ids: list[str], attempt: int = 1) -> None:
    for task_id in task_ids:
        meta = f'{{"status": "SUCCESS", "result": "{task_id}"}}'.encode()
        mirror.append(result_stored(task_id, attempt, "SUCCESS", meta, now()))


def drain(mirror: Recorder, count: int) -> list[str]:
    """``count`` lone tasks published, started and succeeded with their results, flushed as
    a worker's flusher would (its batches hold up to 500 events)."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    for step_id in ids:
        mirror.published(lone(step_id))
    mirror.flush()
    for step_id in ids:
        mirror.started(step_id, 1, worker="w", pid=1)
    mirror.flush()
    for step_id in ids:
        mirror.succeeded(step_id, step_id, 1, {"ok": step_id})
    _results(mirror, ids)
    mirror.flush()
    return ids


@contextmanager
def _own_connection(store: WorkflowStore) -> Iterator[sa.Connection]:
    """For the test's own reads: on an engine of its own, so not among the statements judged."""
    url = store.engine.url.render_as_string(hide_password=False)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def _count(store: WorkflowStore, query: str, **params: Any) -> int:
    with _own_connection(store) as conn:
        return int(conn.execute(sa.text(query), params).scalar_one())


def retried_once(mirror: Recorder) -> str:
    step_id = str(uuid.uuid4())
    mirror.published(lone(step_id))
    mirror.flush()
    mirror.started(step_id, 1, worker="w", pid=1)
    mirror.flush()
    mirror.retried(step_id, 1, ERROR, dt.datetime.now(dt.timezone.utc))
    mirror.flush()
    mirror.started(step_id, 2, worker="w", pid=2)
    mirror.flush()
    mirror.succeeded(step_id, step_id, 2, {"ok": True})
    _results(mirror, [step_id], attempt=2)
    mirror.flush()
    return step_id


def workloads(mirror: Recorder, store: WorkflowStore) -> dict[str, Any]:
    """Each workload, run and checked: what they sent is only worth judging if it worked."""
    ids = drain(mirror, DRAIN)
    assert (
        _count(
            store,
            "SELECT count(*) FROM workflow_runs WHERE status = 'completed' "
            "AND workflow_run_id = ANY(:ids)",
            ids=ids,
        )
        == DRAIN
    )
    assert len(store.results.get_many(ids)) == DRAIN
    step_id = retried_once(mirror)
    # What `runs show` reads: the run and each attempt of its step.
    assert store.get_run(step_id).status == "completed"
    history = store.get_run_history(step_id)
    assert [(a.attempt, a.status) for a in history] == [(1, "failed"), (2, "succeeded")]
    # A direct caller of the store that names only the step: its run is looked up once,
    # and the write names it. A late event of an ended attempt changes nothing.
    store.attempts.record_attempt(step_id, 2, "running")
    assert [(a.attempt, a.status) for a in store.get_run_history(step_id)] == [
        (1, "failed"),
        (2, "succeeded"),
    ]
    return {"drain": ids, "retried": step_id}


def durable_with_child(pikku: PikkuCelery) -> str:
    @pikku.workflow("ship")
    def ship(ctx: Any, order_id: int) -> Any:
        return {"label": ctx.wait_for("label"), "order": order_id}

    @pikku.workflow("order")
    def order(ctx: Any, order_id: int) -> Any:
        ctx.do("charge", lambda: "charged")
        return ctx.do("ship", ship, order_id)

    run_id = order.start(order_id=7)
    settle(pikku)
    child = pikku.store.get_step_state(run_id, "ship").child_run_id
    assert child is not None
    pikku.send(child, "label", {"label": "L-7"})
    settle(pikku)
    assert pikku.store.get_run(run_id).status == "completed"
    return run_id


def chord(mirror: Recorder, store: WorkflowStore) -> str:
    group_id = str(uuid.uuid4())
    parts = [str(uuid.uuid4()) for _ in range(CHORD_PARTS)]
    fired: list[str] = []
    mirror.on_chords_fired(lambda chords: fired.extend(c.group_id for c in chords))
    mirror.append(chord_applied(group_id, parts, b"body"))
    mirror.flush()
    for part in parts:
        mirror.published(lone(part, "part"))
        mirror.started(part, 1, worker="w", pid=1)
    mirror.flush()
    # The header's tasks end over several batches, as several workers' would.
    for start in range(0, CHORD_PARTS, 50):
        chunk = parts[start : start + 50]
        for part in chunk:
            mirror.succeeded(part, part, 1, part)
        _results(mirror, chunk)
        mirror.flush()
    assert fired == [group_id]
    # The body is out: the reaper never sends it again.
    mirror.append(chord_sent(group_id))
    mirror.flush()
    assert store.results.unsent_chords(now() + dt.timedelta(minutes=5)) == []
    # What AsyncResult.get() and GroupResult.get() read.
    assert store.results.get(parts[0]) is not None
    assert len(store.results.get_many(parts)) == CHORD_PARTS
    return group_id


def upkeep(store: WorkflowStore) -> None:
    """The dashboard's counts, the reaper's scans and expiry, once each."""
    assert store.stats.run_counts()["completed"] >= DRAIN
    store.stats.attempt_counts()
    store.stats.attempt_totals()
    store.oldest_running_attempt_age()
    store.count_open_steps(60)
    store.workflow_names()
    store.list_runs(limit=20)
    store.count_runs()
    store.search_runs("0")
    store.reaping.open_attempts(idle_for=60)
    store.reaping.stale_scheduled(older_than=60)
    store.reaping.unsent_claims(older_than=60)
    store.reaping.unsettled_runs(["order"])
    store.results.finish_due_chords(now() - dt.timedelta(minutes=5))
    store.results.unsent_chords(now() - dt.timedelta(minutes=5))
    long_ago = now() - dt.timedelta(days=365)
    store.results.expire(long_ago)
    store.batches.prune_deliveries(long_ago)
    store.count_prunable(long_ago)
    store.count_prunable_runs(long_ago)
    lease = store.leases.take_lease("routing", "me", 30)
    assert lease is not None
    store.leases.renew_lease("routing", "me", lease, 30)
    store.leases.release_lease("routing", "me", lease)


def retire(store: WorkflowStore) -> None:
    """``prune`` and expiry taking everything that has ended, as they take old rows."""
    later = now() + dt.timedelta(minutes=1)
    assert store.prune(later).runs >= DRAIN
    assert store.results.expire(later) >= DRAIN
    store.batches.prune_deliveries(later)


def _keys(store: WorkflowStore) -> set[str]:
    """Every key value of the distributed tables."""
    found: set[str] = set()
    with _own_connection(store) as conn:
        for table, key in DISTRIBUTED.items():
            found.update(conn.execute(sa.text(f'SELECT DISTINCT "{key}" FROM "{table}"')).scalars())
    return found


def judge(recorder: StatementRecorder, copy: PartitionedCopy, keys: set[str]) -> Routing:
    verdicts: dict[str, Verdict] = defaultdict(Verdict)
    unknown: list[Execution] = []
    planned: dict[str, int] = defaultdict(int)
    remainders = {table: copy.remainders(table, keys) for table in DISTRIBUTED}
    for execution in recorder.executions:
        if execution.name is None:
            unknown.append(execution)
            continue
        verdict = verdicts[execution.name]
        verdict.executions += 1
        for parameters in execution.parameter_sets:
            if planned[execution.name] >= PLANNED_PER_NAME:
                break
            planned[execution.name] += 1
            touch = copy.touched(execution.text, parameters)
            if touch.refused is not None:
                verdict.refused.add(touch.refused)
                continue
            carried = carried_strings(parameters) & keys
            for table, kept in touch.partitions.items():
                allowed = {remainders[table][key] for key in carried}
                if len(kept) > verdict.widest.get(table, (0, 0))[0]:
                    verdict.widest[table] = (len(kept), len(carried))
                if touch.locks and len(kept) > 1:
                    verdict.beyond_keys.append(
                        f"{table}: locks rows (FOR UPDATE) in {len(kept)} partitions"
                    )
                beyond = kept - allowed
                if beyond:
                    verdict.beyond_keys.append(
                        f"{table}: {len(kept)} of {PARTITIONS} partitions for "
                        f"{len(carried)} key(s), {len(beyond)} beyond them"
                    )
    return Routing(dict(verdicts), unknown, {}, copy)


@pytest.fixture(scope="module")
def routing(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routing]:
    seconds: dict[str, float] = {}
    started = time.monotonic()
    with ExitStack() as stack:
        store = WorkflowStore(pg_server.create_database("pikku_routing"))
        stack.callback(store.close)
        store.init()
        copy = PartitionedCopy(pg_server.create_database("pikku_routing_split"))
        stack.callback(copy.close)
        # Batches in pieces, one per partition of their keys, as the flusher cuts them on
        # a distributed layout (one transaction per shard group).
        store.db.split_batches_by(lambda keys: copy.remainders("workflow_runs", keys))
        catalogue = Catalogue(store.engine.dialect)
        catalogue.adopt(vars(store.db.sql).values())
        recorder = StatementRecorder(store.engine, catalogue)
        mirror = Recorder(
            store, journal_dir=tmp_path_factory.mktemp("journal") / "routing", background=False
        )
        stack.callback(mirror.close)
        pikku = stack.enter_context(durable_pikku(store))
        seconds["setup"] = time.monotonic() - started
        keys: set[str] = set()
        with recorder.recording():
            for name, workload in (
                ("lone tasks", lambda: workloads(mirror, store)),
                ("chord", lambda: chord(mirror, store)),
                ("durable", lambda: durable_with_child(pikku)),
                ("upkeep", lambda: upkeep(store)),
                ("retire", lambda: retire(store)),
            ):
                if name == "retire":
                    keys = _keys(store)  # before they are gone
                mark = time.monotonic()
                workload()
                seconds[name] = time.monotonic() - mark
        mark = time.monotonic()
        result = judge(recorder, copy, keys)
        seconds["explain"] = time.monotonic() - mark
        result.seconds = seconds
        yield result


def _report(routing: Routing) -> str:
    lines = []
    for name in sorted(routing.verdicts):
        verdict = routing.verdicts[name]
        listed = "fan-out" if name in FAN_OUT else "not-yet" if name in NOT_YET_KEYED else ""
        if verdict.refused:
            how = "refused: " + "; ".join(sorted(verdict.refused))
        elif verdict.beyond_keys:
            how = verdict.beyond_keys[0]
        else:
            how = ", ".join(
                f"{table} {kept}/{PARTITIONS} for {keys} key(s)"
                for table, (kept, keys) in sorted(verdict.widest.items())
            )
        state = "routes" if verdict.routes else "REFUSED" if verdict.refused else "FANS OUT"
        lines.append(f"{name:45} {verdict.executions:5}x {state:8} {listed:8} {how}")
    lines.append(f"times: {routing.seconds}")
    return "\n".join(lines)


def test_every_table_is_distributed_by_one_of_its_columns_or_a_reference_table() -> None:
    assert unclassified_tables() == set()
    assert missing_keys() == {}


def test_the_partitioned_copy_keeps_the_partitions_a_key_falls_in(routing: Routing) -> None:
    copy = routing.copy
    run_id = str(uuid.uuid4())
    [remainder] = {copy.remainders("workflow_runs", [run_id])[run_id]}
    one = copy.touched("SELECT * FROM workflow_runs WHERE workflow_run_id = %(id)s", {"id": run_id})
    assert one.partitions == {"workflow_runs": {remainder}}
    # A run's steps and their run: the join pairs the partitions of one key only.
    joined = copy.touched(
        "SELECT * FROM workflow_step s JOIN workflow_runs r USING (workflow_run_id) "
        "WHERE s.workflow_run_id = %(id)s",
        {"id": run_id},
    )
    assert joined.partitions == {"workflow_step": {remainder}, "workflow_runs": {remainder}}
    every = copy.touched("SELECT count(*) FROM workflow_runs WHERE status = %(s)s", {"s": "x"})
    assert every.partitions == {"workflow_runs": set(range(PARTITIONS))}
    locked = copy.touched(
        "SELECT 1 FROM workflow_runs WHERE workflow_run_id = ANY(%(ids)s) FOR UPDATE",
        {"ids": [run_id, str(uuid.uuid4())]},
    )
    assert locked.locks
    # No unique key without the distribution key, as on Citus: an ON CONFLICT on one is
    # refused, and one on a key that holds it is planned.
    for name, key in DISTRIBUTED.items():
        for constraint in metadata.tables[name].constraints:
            if isinstance(constraint, sa.PrimaryKeyConstraint | sa.UniqueConstraint):
                columns = [column.name for column in constraint.columns]
                upsert = copy.touched(
                    f'INSERT INTO "{name}" ("{key}") VALUES (%(key)s) '
                    f"ON CONFLICT ({', '.join(columns)}) DO NOTHING",
                    {"key": run_id},
                )
                assert (upsert.refused is None) == (key in columns), (name, columns, upsert)


def test_the_listed_statements_are_statements_of_the_store_and_listed_once(
    routing: Routing,
) -> None:
    catalogue = Catalogue(sa.create_engine("postgresql+psycopg://").dialect)
    assert set(FAN_OUT) - catalogue.names == set()
    assert set(NOT_YET_KEYED) - catalogue.names == set()
    assert set(FAN_OUT) & set(NOT_YET_KEYED) == set()
    assert catalogue.ambiguous == {}


def test_every_statement_sent_is_a_named_statement_of_the_store(routing: Routing) -> None:
    texts = sorted({execution.text[:300] for execution in routing.unknown})
    assert texts == [], "statements sent that are not in store/sql:\n" + "\n\n".join(texts)


def test_every_statement_not_listed_touches_only_the_partitions_of_its_keys(
    routing: Routing,
) -> None:
    print(_report(routing))
    fanning = {
        name: sorted(verdict.refused) or verdict.beyond_keys[:3]
        for name, verdict in routing.verdicts.items()
        if not verdict.routes and name not in FAN_OUT and name not in NOT_YET_KEYED
    }
    assert fanning == {}, _report(routing)


def test_a_statement_not_yet_keyed_that_routes_now_comes_off_the_list(routing: Routing) -> None:
    routed = sorted(
        name
        for name, verdict in routing.verdicts.items()
        if name in NOT_YET_KEYED and verdict.routes
    )
    assert routed == [], f"these route now: take them off NOT_YET_KEYED\n{_report(routing)}"


def test_every_listed_statement_is_sent_by_the_workloads(routing: Routing) -> None:
    # A name on a list that nothing here sends is a claim nobody checks: send it here, or
    # take it off.
    unsent = sorted((set(FAN_OUT) | set(NOT_YET_KEYED)) - set(routing.verdicts))
    assert unsent == []
