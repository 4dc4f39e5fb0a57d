"""What a retirement step costs: its wall time, the WAL it writes, the bytes and the dead
row versions it leaves.

The WAL position is the whole server's, so the bench runs on a server of its own
with autovacuum off (a VACUUM the bench did not ask for would land in a step).
Each step starts right after a ``CHECKPOINT``: every page it is first to change
after it is written to WAL whole (``full_page_writes``), as the first change of a
page after any checkpoint is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

__all__ = ["Meter", "Step"]


@dataclass(frozen=True)
class Step:
    """One measured step of a side: what it retired, its seconds and WAL bytes."""

    side: str
    what: str
    runs: int
    seconds: float
    wal_bytes: int
    bytes_before: int
    bytes_after: int
    dead_tuples: int | None = None


class Meter:
    """Readings on one autocommit connection to the bench's database."""

    def __init__(self, conn: sa.Connection) -> None:
        self._conn = conn

    def run(self, sql: str) -> None:
        self._conn.exec_driver_sql(sql)

    def scalar(self, sql: str) -> int:
        return int(self._conn.exec_driver_sql(sql).scalar_one() or 0)

    def _lsn(self) -> str:
        return str(self._conn.exec_driver_sql("SELECT pg_current_wal_insert_lsn()").scalar_one())

    def table_bytes(self, schema: str, tables: Sequence[str]) -> int:
        """Heap, TOAST and indexes of ``tables`` in ``schema``, every partition's."""
        names = ", ".join(f"'{schema}.{table}'" for table in tables)
        return self.scalar(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c WHERE c.relkind = 'r' "
            f"AND coalesce(pg_partition_root(c.oid), c.oid) IN (SELECT unnest(ARRAY[{names}]"
            "::regclass[]))"
        )

    def dead_tuples(self, schema: str, tables: Sequence[str]) -> int:
        """Dead row versions the statistics count in ``tables`` (every partition's): what
        VACUUM must clean."""
        self._conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
        names = ", ".join(f"'{schema}.{table}'" for table in tables)
        return self.scalar(
            "SELECT sum(n_dead_tup) FROM pg_stat_user_tables "
            f"WHERE coalesce(pg_partition_root(relid), relid) IN (SELECT unnest(ARRAY[{names}]"
            "::regclass[]))"
        )

    def step(
        self,
        side: str,
        what: str,
        schema: str,
        tables: Sequence[str],
        action: Callable[[], int],
    ) -> Step:
        """``action`` (which returns the runs it retired) after a checkpoint, measured."""
        before = self.table_bytes(schema, tables)
        self._conn.exec_driver_sql("CHECKPOINT")
        start_lsn = self._lsn()
        start = time.perf_counter()
        runs = action()
        seconds = time.perf_counter() - start
        end_lsn = self._lsn()
        wal = self.scalar(f"SELECT pg_wal_lsn_diff('{end_lsn}', '{start_lsn}')")
        return Step(side, what, runs, seconds, wal, before, self.table_bytes(schema, tables))
