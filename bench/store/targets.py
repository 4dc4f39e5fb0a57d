"""The databases the store bench runs on: PostgreSQL and SQLite, each made fresh."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Protocol

from bench.harness.postgres import BenchDatabases
from bench.harness.sqlite import SqliteFiles
from pikku_celery.store import WorkflowStore

MAIN: Final = "pikku_bench"
BIG: Final = "pikku_bench_big"
#: Days of partitions before today a partitioned target starts with: a month's retention,
#: so every lookup by a run's id alone meets as many partitions as it would in production.
RETAINED_DAYS: Final = 30


class Databases(Protocol):
    def fresh(self, name: str) -> str: ...

    def drop(self) -> None: ...


@dataclass(frozen=True)
class Target:
    """One database kind: where its bench databases are made, and how it explains a plan."""

    name: str
    databases: Databases
    explain_prefix: str
    plan_column: int
    by_day: bool = False

    @contextmanager
    def opened(self, which: str) -> Iterator[WorkflowStore]:
        store = WorkflowStore(self.databases.fresh(which))
        try:
            store.init()
            if self.by_day:
                today = store.partitions.convert().days[0]
                store.partitions.make_days(today - dt.timedelta(days=RETAINED_DAYS), today)
            yield store
        finally:
            store.close()


def targets_of(args: argparse.Namespace) -> list[Target]:
    targets: list[Target] = []
    if args.only in (None, "postgresql"):
        # ANALYZE runs the statement, so the plan shown is the one taken; it is rolled back.
        pg = BenchDatabases(args.pg_url, (MAIN, BIG))
        by_day = args.layout == "partitioned"
        name = "postgresql by day" if by_day else "postgresql"
        targets.append(Target(name, pg, "EXPLAIN (ANALYZE, COSTS OFF) ", 0, by_day))
    if args.only in (None, "sqlite"):
        files = SqliteFiles(args.sqlite_path, (MAIN, BIG))
        targets.append(Target("sqlite", files, "EXPLAIN QUERY PLAN ", 3))
    return targets
