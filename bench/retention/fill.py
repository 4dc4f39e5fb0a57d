"""Finished lone tasks: one written through the store, then copied in the database.

The store writes one lone task as the mirror commits it (its run, step, attempt and
delivery, and its ``pikku://`` result), so the columns it fills and the sizes of its
JSON are the store's own. ``INSERT ... SELECT generate_series`` then copies those
rows inside the database, each copy with ids of its own (UUID-shaped, scattered like
``uuid4``) and its times moved to its place in the spread: a copy's rows keep the
template's offsets from its run's creation, and every row of a copy its run's
``run_day``, as the store writes it. Writing 100,000 tasks through
``apply_batch`` would take minutes here; the copy takes seconds.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa

from bench.store.lone_tasks import apply_batches, lone_task_batch
from pikku_celery import WorkflowStore
from pikku_celery.store import ResultWrite

__all__ = ["CLONED", "Spread", "fill"]

WORKFLOW: Final = "bench.retention.task"

#: The tables a lone task has rows in, parents first, each with the column that names
#: the task's run (a lone task's run, step and Celery task share one id).
CLONED: Final = (
    ("workflow_runs", "workflow_run_id"),
    ("workflow_step", "workflow_run_id"),
    ("workflow_step_history", "workflow_run_id"),
    ("pikku_celery_deliveries", "workflow_run_id"),
    ("pikku_celery_results", "task_id"),
)

# Ids that are not the run's: a new one per copy, from the template's and the copy's number.
_OWN_IDS: Final = frozenset({"history_id", "event_id"})
_CHUNK: Final = 50_000


@dataclass(frozen=True)
class Spread:
    """``runs`` runs created evenly over ``days`` days from ``start`` (a UTC midnight)."""

    start: dt.datetime
    days: int
    runs: int

    @property
    def end(self) -> dt.datetime:
        return self.start + dt.timedelta(days=self.days)

    @property
    def step(self) -> dt.timedelta:
        return (self.end - self.start) / self.runs


def _result_meta(task_id: str, done: dt.datetime) -> bytes:
    # What Celery's JSON serializer makes of an extended result (``result_extended``).
    return json.dumps(
        {
            "status": "SUCCESS",
            "result": {"ok": 1},
            "traceback": None,
            "children": [],
            "date_done": done.isoformat(),
            "task_id": task_id,
            "name": WORKFLOW,
            "args": [1],
            "kwargs": {},
            "worker": "bench@localhost",
            "retries": 0,
            "queue": "celery",
        }
    ).encode()


def _template(store: WorkflowStore) -> str:
    """One finished lone task with its result, written by ``apply_batch``; its id."""
    task_id = str(uuid.uuid4())
    batch = lone_task_batch(store, WORKFLOW, [task_id])
    done = batch.transitions[0].at
    batch.results.append(
        ResultWrite(task_id, 1, "SUCCESS", _result_meta(task_id, done), done, done)
    )
    apply_batches(store, [batch])
    return task_id


def _copy_sql(conn: sa.Connection, table: str, key: str, template: str) -> str:
    columns = conn.execute(
        sa.text(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = :table ORDER BY ordinal_position"
        ),
        {"table": table},
    ).all()
    row = conn.execute(
        sa.text(f"SELECT * FROM {table} WHERE {key} = :id"), {"id": template}
    ).mappings()
    values: dict[str, Any] = dict(row.one())
    names, expressions = [], []
    for name, data_type in columns:
        names.append(name)
        if name == "run_day":
            expressions.append("g.run_day")
        elif data_type == "timestamp with time zone":
            expressions.append(f"t.{name} + g.shift")
        elif values[name] == template:
            expressions.append("g.run_id")
        elif name in _OWN_IDS:
            expressions.append(f"md5(t.{name} || g.i)::uuid::text")
        else:
            expressions.append(f"t.{name}")
    return (
        f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(expressions)} "
        f"FROM {table} t, (SELECT i, md5('run-' || i)::uuid::text AS run_id, "
        "CAST(:base AS interval) + (i - 1) * CAST(:step AS interval) AS shift, "
        "CAST((CAST(:start AS timestamptz) + (i - 1) * CAST(:step AS interval)) "
        "AT TIME ZONE 'UTC' AS date) AS run_day "
        "FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) i) g "
        f"WHERE t.{key} = :template"
    )


def fill(store: WorkflowStore, spread: Spread) -> None:
    """``spread.runs`` finished lone tasks, copies of one the store wrote (then removed)."""
    template = _template(store)
    with store.engine.connect() as conn:
        created = conn.execute(
            sa.text("SELECT created_at FROM workflow_runs WHERE workflow_run_id = :id"),
            {"id": template},
        ).scalar_one()
        base = spread.start - created
        for table, key in CLONED:
            statement = sa.text(_copy_sql(conn, table, key, template))
            for lo in range(1, spread.runs + 1, _CHUNK):
                params = {
                    "lo": lo,
                    "hi": min(lo + _CHUNK - 1, spread.runs),
                    "base": base,
                    "start": spread.start,
                    "step": spread.step,
                    "template": template,
                }
                conn.execute(statement, params)
                conn.commit()
            # Statistics at the table's real size before the next table's foreign-key checks.
            conn.exec_driver_sql(f"ANALYZE {table}")
            conn.commit()
        conn.execute(
            sa.text("DELETE FROM pikku_celery_deliveries WHERE workflow_run_id = :id"),
            {"id": template},
        )
        conn.execute(
            sa.text("DELETE FROM pikku_celery_results WHERE task_id = :id"), {"id": template}
        )
        conn.execute(
            sa.text("DELETE FROM workflow_runs WHERE workflow_run_id = :id"), {"id": template}
        )
        conn.commit()
