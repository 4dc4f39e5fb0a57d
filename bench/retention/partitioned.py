"""The store's run tables RANGE-partitioned by day, beside the store's own, and retired
by dropping a day's partitions.

A copy in schema ``retention_parted`` of each table that holds a run's rows (and of the
results), with one more column, ``run_day``: the UTC day its run was created (a
result's: the day it was written). PostgreSQL keeps a unique key of a partitioned
table only with the partition key in it, so ``run_day`` is added to every primary
key, unique key and foreign key; the other indexes are the store's. One partition a
day. The rows are the store's own rows, copied with their day.

Retiring a day detaches and drops its partition of every table, the tables that
reference another first: a partition that a foreign key still points at cannot be
detached while rows of the referencing table are in it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Final

import sqlalchemy as sa

__all__ = ["PARTED", "SCHEMA", "build", "copy_rows", "day_partitions", "retire_days"]

SCHEMA: Final = "retention_parted"

#: Each partitioned table, parents first, and how its day is found in the store's table.
_RUN_DAY: Final = (
    "(SELECT (r.created_at AT TIME ZONE 'UTC')::date FROM public.workflow_runs r "
    "WHERE r.workflow_run_id = t.workflow_run_id)"
)
PARTED: Final = {
    "workflow_runs": "(t.created_at AT TIME ZONE 'UTC')::date",
    "workflow_step": _RUN_DAY,
    "workflow_step_history": _RUN_DAY,
    "pikku_celery_deliveries": _RUN_DAY,
    "pikku_celery_run_events": _RUN_DAY,
    "pikku_celery_chords": _RUN_DAY,
    "pikku_celery_results": "(t.updated_at AT TIME ZONE 'UTC')::date",
}

_FOREIGN_KEY: Final = re.compile(
    r"FOREIGN KEY \((?P<cols>[^)]*)\) REFERENCES (?P<table>[\w.]+)\((?P<refs>[^)]*)\)(?P<rest>.*)"
)


def _partition(table: str, day: dt.date) -> str:
    return f"{SCHEMA}.{table}_{day:%Y%m%d}"


def _days(first: dt.date, count: int) -> Iterator[dt.date]:
    for offset in range(count):
        yield first + dt.timedelta(days=offset)


def _keys(conn: sa.Connection, table: str) -> list[str]:
    """The store's primary and unique keys of ``table``, each with ``run_day`` added."""
    rows = conn.execute(
        sa.text(
            "SELECT conname, contype, array(SELECT a.attname FROM unnest(c.conkey) "
            "WITH ORDINALITY k(n, o) JOIN pg_attribute a ON a.attrelid = c.conrelid "
            "AND a.attnum = k.n ORDER BY k.o) FROM pg_constraint c "
            "WHERE c.conrelid = CAST(:table AS regclass) AND c.contype IN ('p', 'u')"
        ),
        {"table": f"public.{table}"},
    ).all()
    return [
        f"ALTER TABLE {SCHEMA}.{table} ADD CONSTRAINT {name} "
        f"{'PRIMARY KEY' if kind == 'p' else 'UNIQUE'} ({', '.join([*columns, 'run_day'])})"
        for name, kind, columns in rows
    ]


def _indexes(conn: sa.Connection, table: str) -> list[str]:
    """The store's other indexes of ``table``, on the copy."""
    definitions = conn.execute(
        sa.text(
            "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "WHERE i.indrelid = CAST(:table AS regclass) AND NOT EXISTS "
            "(SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)"
        ),
        {"table": f"public.{table}"},
    ).scalars()
    made = []
    for definition in definitions:
        if definition.startswith("CREATE UNIQUE INDEX"):
            raise RuntimeError(f"a unique index outside a constraint, not copied: {definition}")
        made.append(definition.replace(f" ON public.{table} ", f" ON {SCHEMA}.{table} ", 1))
    return made


def _foreign_keys(conn: sa.Connection, table: str) -> list[str]:
    """The store's foreign keys of ``table``, through ``run_day`` too, between the copies."""
    rows = conn.execute(
        sa.text(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = CAST(:table AS regclass) AND contype = 'f'"
        ),
        {"table": f"public.{table}"},
    ).all()
    made = []
    for name, definition in rows:
        match = _FOREIGN_KEY.fullmatch(definition)
        if match is None or match["table"].removeprefix("public.") not in PARTED:
            raise RuntimeError(f"a foreign key the copy cannot take: {definition}")
        made.append(
            f"ALTER TABLE {SCHEMA}.{table} ADD CONSTRAINT {name} FOREIGN KEY "
            f"({match['cols']}, run_day) REFERENCES "
            f"{SCHEMA}.{match['table'].removeprefix('public.')} ({match['refs']}, run_day)"
            f"{match['rest']}"
        )
    return made


def build(conn: sa.Connection, first: dt.date, days: int) -> None:
    """The partitioned copies, empty, with a partition for each of ``days`` days."""
    statements = [f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE", f"CREATE SCHEMA {SCHEMA}"]
    for table in PARTED:
        statements.append(
            f"CREATE TABLE {SCHEMA}.{table} (LIKE public.{table} INCLUDING DEFAULTS, "
            "run_day date NOT NULL) PARTITION BY RANGE (run_day)"
        )
        for day in _days(first, days):
            statements.append(
                f"CREATE TABLE {_partition(table, day)} PARTITION OF {SCHEMA}.{table} "
                f"FOR VALUES FROM ('{day}') TO ('{day + dt.timedelta(days=1)}')"
            )
        statements += _keys(conn, table) + _indexes(conn, table)
    for table in PARTED:
        statements += _foreign_keys(conn, table)
    for statement in statements:
        conn.exec_driver_sql(statement)
    conn.commit()


def copy_rows(conn: sa.Connection) -> None:
    """Every row of the store's tables into its copy, with its day."""
    for table, day in PARTED.items():
        conn.exec_driver_sql(
            f"INSERT INTO {SCHEMA}.{table} SELECT t.*, {day} FROM public.{table} t"
        )
        conn.commit()
        conn.exec_driver_sql(f"ANALYZE {SCHEMA}.{table}")
        conn.commit()


def day_partitions(first: dt.date, days: int) -> list[str]:
    """Every partition of the ``days`` days from ``first``."""
    return [_partition(table, day) for table in PARTED for day in _days(first, days)]


def retire_days(conn: sa.Connection, first: dt.date, days: int) -> None:
    """Detach and drop the partitions of ``days`` days from ``first``, a statement each in
    its own transaction (as a scheduled job would), referencing tables first."""
    for day in _days(first, days):
        for table in reversed(PARTED):
            partition = _partition(table, day)
            conn.exec_driver_sql(f"ALTER TABLE {SCHEMA}.{table} DETACH PARTITION {partition}")
            conn.commit()
            conn.exec_driver_sql(f"DROP TABLE {partition}")
            conn.commit()
