"""What the PostgreSQL server spent, read at the two ends of a measured interval.

CPU: every process of the server, from ``/proc``: the postmaster, each of its
children (client backends, WAL writer, checkpointer, background writer,
autovacuum, ...) and the children it reaped meanwhile (a backend whose client
disconnected leaves its CPU in the postmaster's count of reaped children). On
the bench's own server all of that is the workload's, but for the one
connection the bench reads through, whose backend's CPU is read apart and taken
off. Commits: the transaction ids the server handed out (every transaction
that wrote takes one; a read-only one takes none and flushes nothing). WAL: its
insert position. Notifications: the reading connection ``LISTEN``s on the
result backend's channel and counts what it hears, one per ``NOTIFY`` a commit
sent. Bytes kept: ``pg_total_relation_size`` of each table (heap, TOAST,
indexes) in the workload's database.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

import psycopg
import sqlalchemy as sa

from pikku_celery.store.result_watch import CHANNEL

__all__ = ["Process", "Reader", "Reading", "server_ticks"]

_SUCCEEDED: Final = sa.text("SELECT count(*) FROM workflow_step WHERE status = 'succeeded'")
_POSITION: Final = sa.text(
    "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, "
    "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
)
_SIZES: Final = sa.text(
    "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind IN ('r', 'p') "
    "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'"
)


class Process(NamedTuple):
    pid: int
    parent: int
    #: User + system clock ticks of the process itself.
    own: int
    #: The same of its children it has reaped.
    reaped: int


def processes() -> Iterator[Process]:
    """Every process of the machine, as ``/proc/<pid>/stat`` gives it."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone since the listing
        rest = text[text.rindex(")") + 2 :].split()
        own, reaped = int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])
        yield Process(int(entry.name), int(rest[1]), own, reaped)


def server_ticks(every: Iterable[Process], postmaster: int) -> int:
    """Clock ticks of the server ``postmaster`` leads: its own, its live children's and
    those of the children it reaped."""
    total = 0
    for process in every:
        if process.pid == postmaster:
            total += process.own + process.reaped
        elif process.parent == postmaster:
            total += process.own
    return total


def _ticks_of(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2 :].split()
    return int(rest[11]) + int(rest[12])


@dataclass(frozen=True)
class Reading:
    """The server's counters at one moment."""

    #: CPU seconds of every process of the server so far.
    server_cpu: float
    #: CPU seconds of the bench's own reading backend so far (part of ``server_cpu``).
    reader_cpu: float
    wal_bytes: int
    next_xid: int
    #: Notifications heard on the result backend's channel so far.
    notifies: int
    #: Bytes of each table of the workload's database, with its TOAST and indexes.
    sizes: dict[str, int]


class Reader:
    """One connection to the workload's database on the server on this machine."""

    def __init__(self, url: str) -> None:
        self._engine = sa.create_engine(url, poolclass=sa.StaticPool, isolation_level="AUTOCOMMIT")
        self._conn = self._engine.connect()
        self.backend = int(self._conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        self.postmaster = next(p.parent for p in processes() if p.pid == self.backend)
        self._tick = os.sysconf("SC_CLK_TCK")
        self._heard = 0
        driver = self._conn.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        # psycopg hands the notifications that came with any reply to this handler.
        driver.add_notify_handler(self._hear)
        self._conn.exec_driver_sql(f'LISTEN "{CHANNEL}"')

    def _hear(self, notify: psycopg.Notify) -> None:
        self._heard += 1

    def succeeded(self) -> int:
        """The steps SQL shows as succeeded."""
        return int(self._conn.execute(_SUCCEEDED).scalar_one())

    def read(self) -> Reading:
        wal, xid = self._conn.execute(_POSITION).one()
        sizes = {str(name): int(size) for name, size in self._conn.execute(_SIZES).all()}
        return Reading(
            server_cpu=server_ticks(processes(), self.postmaster) / self._tick,
            reader_cpu=_ticks_of(self.backend) / self._tick,
            wal_bytes=int(wal),
            next_xid=int(xid),
            notifies=self._heard,
            sizes=sizes,
        )

    def close(self) -> None:
        self._conn.close()
        self._engine.dispose()
