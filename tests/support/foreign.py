"""A run another tool wrote straight into the tables, in that tool's own forms.

On SQLite the forms are those Pikku's SQLite plugin writes: times as ISO text
with milliseconds and ``Z`` (and the database default, naive, where Pikku
leaves a time out), booleans as ``'true'``/``'false'`` text, objects as JSON
text and a bare string as it is. On PostgreSQL they are those of a driver
that sends JSON text as a JSON string (postgres.js): each JSON column holds a
``jsonb`` string whose content is JSON text.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa

from pikku_celery.schema.partitions import is_partitioned

UTC = dt.timezone.utc

PIKKU_ERROR: Final = {
    "message": "boom at the gateway",
    "stack": "Error: boom at the gateway\n    at charge (charge.ts:3:9)",
    "code": "RPC_NOT_FOUND",
}


@dataclass(frozen=True)
class ForeignRun:
    run_id: str
    failed_step: str
    succeeded_step: str
    created_at: dt.datetime
    updated_at: dt.datetime
    running_at: dt.datetime
    failed_at: dt.datetime


def _json_sqlite(value: Any) -> str:
    # Pikku's plugin: objects and arrays as JSON text, a string as it is.
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def insert_foreign_run(engine: sa.Engine, run_id: str = "pikku-run-1") -> ForeignRun:
    pg = engine.dialect.name == "postgresql"
    if pg:
        # A jsonb string holding the JSON text, as postgres.js stores it.
        def j(value: Any) -> sa.ColumnElement[Any]:
            return sa.func.to_jsonb(sa.cast(json.dumps(value), sa.Text))

        def t(text: str) -> sa.ColumnElement[Any]:
            return sa.cast(text.replace(" ", "T") + ("" if text.endswith("Z") else "Z"), sa.Text)

        flag: Any = sa.true
        flag_false: Any = sa.false
    else:

        def j(value: Any) -> sa.ColumnElement[Any]:
            return sa.literal(_json_sqlite(value), sa.Text)

        def t(text: str) -> sa.ColumnElement[Any]:
            return sa.literal(text, sa.Text)

        def flag() -> sa.ColumnElement[Any]:
            return sa.literal("true", sa.Text)

        def flag_false() -> sa.ColumnElement[Any]:
            return sa.literal("false", sa.Text)

    def time(text: str) -> sa.ColumnElement[Any]:
        return sa.cast(t(text), sa.DateTime(timezone=True)) if pg else t(text)

    runs = sa.table(
        "workflow_runs",
        *map(
            sa.column,
            "workflow_run_id workflow status input output error state inline graph_hash "
            "deterministic planned_steps wire created_at updated_at run_day".split(),
        ),
    )
    steps = sa.table(
        "workflow_step",
        *map(
            sa.column,
            "workflow_step_id workflow_run_id step_name rpc_name data status result error "
            "retries retry_delay current_attempt created_at updated_at run_day".split(),
        ),
    )
    history = sa.table(
        "workflow_step_history",
        *map(
            sa.column,
            "history_id workflow_step_id status result error attempt created_at running_at "
            "succeeded_at failed_at workflow_run_id run_day".split(),
        ),
    )
    versions = sa.table(
        "workflow_versions",
        *map(sa.column, "workflow_name graph_hash graph source status created_at".split()),
    )
    failed_step, succeeded_step = f"{run_id}-charge", f"{run_id}-ship"
    with engine.begin() as conn:
        # Not one of Pikku's columns either: the run's day, which the partitioned layout
        # takes a row only with (data contract); the plain layout asks nothing of a writer.
        day = {"run_day": dt.date(2026, 12, 1)} if is_partitioned(conn) else {}
        conn.execute(
            sa.insert(runs).values(
                **day,
                workflow_run_id=run_id,
                workflow="pikku.order",
                status="failed",
                input=j({"order": 1}),
                output=j("order 1 shipped"),
                error=j(PIKKU_ERROR),
                state=j({"receiptId": "r-1"}),
                inline=flag(),
                graph_hash="abc123",
                deterministic=flag_false(),
                planned_steps=j([{"stepName": "charge"}, {"stepName": "ship"}]),
                wire=j({"type": "http"}),
                # Pikku leaves created_at to the database default: naive on SQLite.
                created_at=time("2026-12-01 07:09:14"),
                updated_at=time("2026-12-01T07:09:15.250Z"),
            )
        )
        for step_id, name, status, result, error, delay in (
            (succeeded_step, "ship", "succeeded", "shipped", None, "200ms"),
            (failed_step, "charge", "failed", None, PIKKU_ERROR, "5s"),
        ):
            conn.execute(
                sa.insert(steps).values(
                    **day,
                    workflow_step_id=step_id,
                    workflow_run_id=run_id,
                    step_name=name,
                    rpc_name=name,
                    data=j({"amount": 5}),
                    status=status,
                    result=None if result is None else j(result),
                    error=None if error is None else j(error),
                    retries=3,
                    retry_delay=delay,
                    current_attempt=1,
                    created_at=time("2026-12-01T07:09:14.500Z"),
                    updated_at=time("2026-12-01T07:09:15.000Z"),
                )
            )
            conn.execute(
                sa.insert(history).values(
                    **day,
                    history_id=f"{step_id}-1",
                    # Not one of Pikku's columns: the attempt's run, which a writer of
                    # pikku-celery's tables gives since revision 0013 (data contract).
                    workflow_run_id=run_id,
                    workflow_step_id=step_id,
                    status=status,
                    result=None if result is None else j(result),
                    error=None if error is None else j(error),
                    attempt=1,
                    created_at=time("2026-12-01T07:09:14.500Z"),
                    running_at=time("2026-12-01T07:09:14.600Z"),
                    succeeded_at=None if error else time("2026-12-01T07:09:15.000Z"),
                    failed_at=time("2026-12-01T07:09:15.000Z") if error else None,
                )
            )
        conn.execute(
            sa.insert(versions).values(
                workflow_name="pikku.order",
                graph_hash="abc123",
                graph=j({"nodes": {"charge": {}}}),
                source="dsl",
                status="active",
                created_at=time("2026-12-01 07:09:14"),
            )
        )
    return ForeignRun(
        run_id=run_id,
        failed_step=failed_step,
        succeeded_step=succeeded_step,
        created_at=dt.datetime(2026, 12, 1, 7, 9, 14, tzinfo=UTC),
        updated_at=dt.datetime(2026, 12, 1, 7, 9, 15, 250000, tzinfo=UTC),
        running_at=dt.datetime(2026, 12, 1, 7, 9, 14, 600000, tzinfo=UTC),
        failed_at=dt.datetime(2026, 12, 1, 7, 9, 15, tzinfo=UTC),
    )
