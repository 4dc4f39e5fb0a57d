"""Removing old settled runs, with their steps and attempts, a batch at a time.

Each batch is its own short transaction: a prune of millions of rows never
holds locks (or a SQLite write lock) for longer than one batch, and progress
made before an interruption stays made. Where the tables are laid out by day
(``schema/partitions.py``), a whole day older than the cut whose runs are all
prunable goes first, by dropping its partitions; the rest is deleted as anywhere.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa

from pikku_celery.errors import InvalidStatus
from pikku_celery.store import sql
from pikku_celery.store.connector import Connector
from pikku_celery.store.day_partitions import DayPartitions
from pikku_celery.store.models import RUN_STATUSES, SETTLED_RUN_STATUSES

__all__ = ["DEFAULT_PRUNE_STATUSES", "PruneCount", "Pruning"]

DEFAULT_PRUNE_STATUSES: Final = tuple(sorted(SETTLED_RUN_STATUSES))


@dataclass(frozen=True, slots=True)
class PruneCount:
    """Runs, and the steps and attempts that belong to them."""

    runs: int = 0
    steps: int = 0
    attempts: int = 0

    def __add__(self, other: PruneCount) -> PruneCount:
        return PruneCount(
            self.runs + other.runs, self.steps + other.steps, self.attempts + other.attempts
        )


def _settled(statuses: Iterable[str]) -> list[str]:
    chosen = sorted(set(statuses))
    if not chosen:
        raise ValueError("Name at least one run status to prune.")
    for status in chosen:
        if status not in SETTLED_RUN_STATUSES:
            # A running or suspended run is still being worked on: never prunable.
            kind = "prunable run" if status in RUN_STATUSES else "run"
            raise InvalidStatus(kind, status, SETTLED_RUN_STATUSES)
    return chosen


def _check_before(before: dt.datetime) -> None:
    if before.tzinfo is None:
        raise ValueError("`before` must be an aware datetime (UTC), not a naive one.")


class Pruning:
    """Deleting settled runs in batches, each batch its own short transaction."""

    def __init__(self, db: Connector, partitions: DayPartitions | None = None) -> None:
        self._db = db
        self._partitions = partitions or DayPartitions(db)

    def count_prunable(
        self,
        before: dt.datetime,
        statuses: Iterable[str] = DEFAULT_PRUNE_STATUSES,
        *,
        conn: sa.Connection | None = None,
    ) -> PruneCount:
        """How many runs (steps, attempts) in ``statuses`` were created before ``before``."""
        _check_before(before)
        params = {"statuses": _settled(statuses), "before": before}
        with self._db.read(conn) as c:
            row = c.execute(sql.prune.count_prunable, params).one()
        return PruneCount(int(row.runs), int(row.steps), int(row.attempts))

    def count_prunable_runs(
        self,
        before: dt.datetime,
        statuses: Iterable[str] = DEFAULT_PRUNE_STATUSES,
        *,
        conn: sa.Connection | None = None,
    ) -> int:
        """How many runs ``count_prunable`` would count, without reading their steps."""
        _check_before(before)
        params = {"statuses": _settled(statuses), "before": before}
        with self._db.read(conn) as c:
            return int(c.execute(sql.prune.count_prunable_runs, params).scalar_one())

    def prune_batch(
        self,
        before: dt.datetime,
        statuses: Iterable[str] = DEFAULT_PRUNE_STATUSES,
        limit: int = 500,
        *,
        conn: sa.Connection | None = None,
    ) -> PruneCount:
        """Delete the ``limit`` oldest prunable runs, in one transaction; returns what went.

        Steps and attempts go with their runs. A run that is locked by another
        transaction (being resumed, or pruned by someone else) is skipped.
        """
        _check_before(before)
        if limit < 1:
            raise ValueError("A prune batch needs a limit of 1 or more.")
        chosen = _settled(statuses)
        params = {
            "statuses": chosen,
            "before": before,
            "limit": limit,
            **sql.prune.status_params(chosen),
        }
        with self._db.locked_write(conn) as c:
            self._db.layout.learn(c)  # a process that only prunes has written no batch
            groups = self._db.key_groups if conn is None else None
            candidates = list(c.execute(sql.prune.oldest_prunable(len(chosen)), params).scalars())
            if not candidates:
                return PruneCount()
            if groups is None:
                return self._delete(c, params, candidates)
        # Distributed: each shard's runs locked and deleted in a transaction of their own, as
        # a database that locks rows on one shard per statement needs.
        by_group: dict[int, list[str]] = {}
        for run_id, group in groups(candidates).items():
            by_group.setdefault(group, []).append(run_id)
        total = PruneCount()
        for group in sorted(by_group):
            with self._db.locked_write(None) as c:
                total += self._delete(c, params, sorted(by_group[group]))
        return total

    @staticmethod
    def _delete(c: sa.Connection, params: dict[str, Any], candidates: list[str]) -> PruneCount:
        """Lock the candidates still prunable (skipping those another holds), delete them."""
        ids = list(c.execute(sql.prune.lock_batch, {**params, "ids": candidates}).scalars())
        if not ids:
            return PruneCount()
        children = c.execute(sql.prune.count_batch_children, {"ids": ids}).one()
        deleted = c.execute(sql.prune.delete_runs, {**params, "ids": ids}).rowcount
        return PruneCount(deleted, int(children.steps), int(children.attempts))

    def prune(
        self,
        before: dt.datetime,
        statuses: Iterable[str] = DEFAULT_PRUNE_STATUSES,
        *,
        batch_size: int = 500,
        on_batch: Callable[[PruneCount], None] | None = None,
    ) -> PruneCount:
        """Delete every prunable run, ``batch_size`` runs per transaction; returns the total.

        ``on_batch`` is called after each committed batch with the running total. Where
        the tables are laid out by day, every day wholly before ``before`` whose runs are
        all in ``statuses`` is dropped first (its partitions, a transaction a day).
        """
        _check_before(before)
        chosen = _settled(statuses)
        total = PruneCount()
        if self._partitions.partitioned():
            # The days ahead too: a deployment that runs no reaper (whose upkeep makes them)
            # keeps its layout with a daily prune alone.
            self._partitions.keep(None)
            total = self._drop_days(before, chosen)
            if total.runs and on_batch is not None:
                on_batch(total)
        while True:
            batch = self.prune_batch(before, chosen, batch_size)
            if batch.runs == 0:
                return total
            total += batch
            if on_batch is not None:
                on_batch(total)

    def _drop_days(self, before: dt.datetime, statuses: list[str]) -> PruneCount:
        # A day wholly before ``before``: its last instant (the next midnight) is not after it.
        days = self._partitions.drop_days(
            before.astimezone(dt.timezone.utc).date(), statuses=statuses
        )
        return sum(
            (
                PruneCount(
                    day.rows.get("workflow_runs", 0),
                    day.rows.get("workflow_step", 0),
                    day.rows.get("workflow_step_history", 0),
                )
                for day in days
            ),
            PruneCount(),
        )
