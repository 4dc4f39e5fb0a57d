"""How each dialect sends the statements of a batch (``store/batches.py``).

The dialect's catalogue (``store/dialect.py``) makes its own: PostgreSQL sends each kind
of row as one set-based statement over a JSON array, however large the batch, and the
statements whose answer nothing waits for (``later``) together in pipeline mode, one round
trip; SQLite, a file with no round trips to save, one ``executemany`` per kind of row.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec
import sqlalchemy as sa

from pikku_celery.store import sql
from pikku_celery.store.mirror_batch import NewStep

if TYPE_CHECKING:
    from pikku_celery.store.connector import Connector
    from pikku_celery.store.dialect import SQLite

__all__ = ["BatchWrites", "Later", "PostgresWrites", "SqliteWrites"]

#: Statements of a batch whose answer nothing waits for, sent together by ``send``.
Later = list[tuple[sa.Executable, dict[str, Any]]]


# Compiled, and writes a datetime as ISO 8601 itself (``Z`` for UTC, which PostgreSQL
# reads as timestamptz): a third of the CPU ``json.dumps`` with a ``default`` took here.
_ENCODER: Final = msgspec.json.Encoder()


def _days(days: Iterable[dt.date | None]) -> dict[str, dt.date | None]:
    """The range of days a statement's rows are of (``sql.batches.on_days``)."""
    known = [day for day in days if day is not None]
    return {"first_day": min(known, default=None), "last_day": max(known, default=None)}


def _array(rows: list[dict[str, Any]]) -> str:
    """Rows as one JSON array, for ``jsonb_to_recordset``."""
    return _ENCODER.encode(rows).decode()


class BatchWrites(Protocol):
    """How one dialect sends each kind of a batch's statements."""

    def known_steps(self, c: sa.Connection, step_ids: list[str]) -> Iterable[Any]: ...

    def known_runs(self, c: sa.Connection, run_ids: list[str]) -> dict[str, dt.date | None]:
        """The runs of these ids that exist, with their days."""
        ...

    def steps_present(
        self, c: sa.Connection, run_ids: list[str], step_ids: list[str], run_days: list[dt.date]
    ) -> set[str]: ...

    def write_steps(
        self,
        c: sa.Connection,
        rows: list[dict[str, Any]],
        placed: Sequence[NewStep],
        deliveries: list[dict[str, Any]],
    ) -> tuple[set[str], set[str]]:
        """Insert the steps and count the ``deliveries`` (``count_deliveries``); returns the
        ids of the steps known to be there now (the others are looked up with
        ``steps_present``) and the deliveries counted now."""
        ...

    def count_deliveries(self, c: sa.Connection, rows: list[dict[str, Any]]) -> set[str]: ...

    def write_transitions(
        self, c: sa.Connection, status: str, rows: list[dict[str, Any]], later: Later
    ) -> None: ...

    def write_outcomes(
        self,
        c: sa.Connection,
        complete: dict[str, dt.datetime],
        settle: list[dict[str, Any]],
        later: Later,
        days: Mapping[str, dt.date | None],
    ) -> None:
        """End these runs; ``days``: the day of each that the caller knows."""
        ...

    def send(self, c: sa.Connection, later: Later, *, commit: bool = False) -> None:
        """Send what waits in ``later``, in order, and empty it; ``commit``: the transaction
        is the batch's own and ends here (the caller's COMMIT then finds nothing to do)."""
        ...


class PostgresWrites:
    """Set-based: each kind of row is one statement over a JSON array; what nothing waits
    for goes in one pipeline."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def known_steps(self, c: sa.Connection, step_ids: list[str]) -> Iterable[Any]:
        return c.execute(sql.batches.known_steps_pg, {"step_ids": step_ids})

    def known_runs(self, c: sa.Connection, run_ids: list[str]) -> dict[str, dt.date | None]:
        return {str(r[0]): r[1] for r in c.execute(sql.batches.known_runs_pg, {"run_ids": run_ids})}

    def steps_present(
        self, c: sa.Connection, run_ids: list[str], step_ids: list[str], run_days: list[dt.date]
    ) -> set[str]:
        params = {"run_ids": run_ids, "step_ids": step_ids, **_days(run_days)}
        return set(c.execute(sql.batches.steps_present_pg, params).scalars())

    def write_steps(
        self,
        c: sa.Connection,
        rows: list[dict[str, Any]],
        placed: Sequence[NewStep],
        deliveries: list[dict[str, Any]],
    ) -> tuple[set[str], set[str]]:
        # Steps of lone tasks bring their run; the two shapes never share a run,
        # so sending each shape as its own batch keeps names in publish order. Lone
        # tasks, the common case, go in one set-based statement.
        lone: dict[str, dict[str, Any]] = {}
        for with_run in (True, False):
            same = []
            for row, step in zip(rows, placed, strict=True):
                if (step.run_workflow is not None) is not with_run:
                    continue
                if with_run and step.run_id == step.step_id:
                    lone.setdefault(step.step_id, row)
                else:
                    same.append(row)
            self._db.run_many(c, sql.attempts.schedule_step_pg(with_run), same)
        # With the BEGIN of a batch that starts with them, and the deliveries in the same
        # round trip; the statement returns the steps it wrote and those that were there
        # before it, so most batches look up none.
        calls: Later = []
        if lone:
            calls.append(
                (
                    sql.batches.schedule_lone_steps_pg,
                    # In key order: two batches writing the same lone tasks (their
                    # publisher's and their worker's) wait for one another, never deadlock.
                    {
                        "rows": _array([lone[k] for k in sorted(lone)]),
                        "run_ids": sorted(lone),
                    }
                    | _days(row["run_day"] for row in lone.values()),
                )
            )
        if deliveries:
            calls.append((sql.batches.count_deliveries_pg, {"rows": _array(deliveries)}))
        answers = self._db.pipelined(c, calls)
        present = {step_id for (step_id,) in answers[0]} if lone else set()
        counted = {event_id for (event_id,) in answers[-1]} if deliveries else set()
        return present, counted

    def count_deliveries(self, c: sa.Connection, rows: list[dict[str, Any]]) -> set[str]:
        text = _array(rows)
        return set(self._db.run(c, sql.batches.count_deliveries_pg, {"rows": text}).scalars())

    def write_transitions(
        self, c: sa.Connection, status: str, rows: list[dict[str, Any]], later: Later
    ) -> None:
        ids = sorted({row["step_id"] for row in rows})
        runs = sorted({row["run_id"] for row in rows})
        days = _days(row["run_day"] for row in rows)
        self._set(
            later, sql.batches.record_attempts_pg(status), rows, run_ids=runs, step_ids=ids, **days
        )

    def write_outcomes(
        self,
        c: sa.Connection,
        complete: dict[str, dt.datetime],
        settle: list[dict[str, Any]],
        later: Later,
        days: Mapping[str, dt.date | None],
    ) -> None:
        ended = sorted({r["run_id"] for r in settle} | set(complete))
        if not ended:
            return
        unknown = [run_id for run_id in ended if run_id not in days]
        found = self.known_runs(c, unknown) if unknown else {}
        run_days = _days(days.get(run_id, found.get(run_id)) for run_id in ended)
        # Every run the batch ends is locked first, in id order (after its steps). In one
        # pipeline the statements still run one after the other, each with a snapshot of
        # its own: the completion check sees what other batches committed before the lock.
        later.append((sql.batches.lock_runs_pg, {"run_ids": ended, **run_days}))
        if settle:
            rows = [
                {"run_id": r["run_id"], "now": r["now"], "status": r["new_status"]}
                | {"error": r["error"]}
                for r in settle
            ]
            ids = sorted({r["run_id"] for r in rows})
            self._set(later, sql.batches.settle_runs_pg, rows, run_ids=ids, **run_days)
        if complete:
            rows = [{"run_id": run_id, "now": at} for run_id, at in complete.items()]
            # A batch cut by shard names its runs in every subquery: one shard's update.
            complete_runs = (
                sql.batches.complete_runs_pg
                if self._db.key_groups is None
                else sql.batches.complete_runs_keyed_pg
            )
            self._set(later, complete_runs, rows, run_ids=sorted(complete), **run_days)

    def send(self, c: sa.Connection, later: Later, *, commit: bool = False) -> None:
        self._db.pipelined(c, later, commit=commit)
        later.clear()

    @staticmethod
    def _set(
        later: Later, statement: sa.Executable, rows: list[dict[str, Any]], **ids: Any
    ) -> None:
        """One statement for all the rows, sent as one JSON array."""
        if rows:
            later.append((statement, {"rows": _array(rows), **ids}))


class SqliteWrites:
    """One ``executemany`` per kind of row: no round trips to save in a file."""

    def __init__(self, db: Connector, sql: SQLite) -> None:
        self._db = db
        self._sql = sql

    def known_steps(self, c: sa.Connection, step_ids: list[str]) -> Iterable[Any]:
        return c.execute(sql.batches.known_steps, {"step_ids": step_ids})

    def known_runs(self, c: sa.Connection, run_ids: list[str]) -> dict[str, dt.date | None]:
        return {str(r[0]): r[1] for r in c.execute(sql.batches.known_runs, {"run_ids": run_ids})}

    def steps_present(
        self, c: sa.Connection, run_ids: list[str], step_ids: list[str], run_days: list[dt.date]
    ) -> set[str]:
        params = {"run_ids": run_ids, "step_ids": step_ids}
        return set(c.execute(sql.batches.steps_present, params).scalars())

    def write_steps(
        self,
        c: sa.Connection,
        rows: list[dict[str, Any]],
        placed: Sequence[NewStep],
        deliveries: list[dict[str, Any]],
    ) -> tuple[set[str], set[str]]:
        run_rows = [
            {
                "workflow_run_id": r["run_id"],
                "workflow": r["run_workflow"],
                "status": "running",
                "input": r["run_input"],
                "state": "{}",
                "inline": False,
                "deterministic": False,
                "wire": r["run_wire"],
                "created_at": r["now"],
                "updated_at": r["now"],
                "run_day": r["run_day"],
            }
            for r in rows
            if r["run_workflow"] is not None
        ]
        if run_rows:
            c.execute(self._sql.insert_run_once, run_rows)
        self._db.run_many(c, self._sql.schedule_step, rows)
        self._db.run_many(c, self._sql.schedule_attempt, rows)
        return set(), self.count_deliveries(c, deliveries) if deliveries else set()

    def count_deliveries(self, c: sa.Connection, rows: list[dict[str, Any]]) -> set[str]:
        return set(c.execute(self._sql.count_deliveries, rows).scalars())

    def write_transitions(
        self, c: sa.Connection, status: str, rows: list[dict[str, Any]], later: Later
    ) -> None:
        for statement in self._sql.record_attempts(status):
            self._db.run_many(c, statement, rows)

    def write_outcomes(
        self,
        c: sa.Connection,
        complete: dict[str, dt.datetime],
        settle: list[dict[str, Any]],
        later: Later,
        days: Mapping[str, dt.date | None],
    ) -> None:
        if settle:
            self._db.run_many(c, sql.attempts.settle_run, settle)
        if complete:
            rows = [{"run_id": run_id, "now": at} for run_id, at in sorted(complete.items())]
            # Touched first, in one order: two batches finishing steps of the same
            # runs lock them in the same order and never deadlock.
            self._db.run_many(c, sql.attempts.touch_run, rows)
            self._db.run_many(c, sql.attempts.complete_run_if_done, rows)

    def send(self, c: sa.Connection, later: Later, *, commit: bool = False) -> None:
        """Nothing waits: each statement was sent as it came, and SQLAlchemy commits."""
