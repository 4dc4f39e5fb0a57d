"""Bulk-loading runs, steps and attempts inside the database, for the index check.

Rows are made by one ``INSERT ... SELECT`` per table (``generate_series`` on
PostgreSQL, a recursive CTE on SQLite): a million attempt rows load in
seconds, where the store's own writes would take many minutes.
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa

__all__ = ["Bulk", "count_rows"]

ATTEMPTS_PER_BULK_STEP: Final = 4
STEPS_PER_BULK_RUN: Final = 10
BULK_CHUNK: Final = 250_000


class Bulk:
    """Loads runs, steps and attempts with one INSERT ... SELECT each, in the database."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.pg = engine.dialect.name == "postgresql"
        self.runs = self.steps = self.attempts = 0

    def _series(self) -> tuple[str, str]:
        if self.pg:
            return "", "generate_series(CAST(:lo AS BIGINT), CAST(:hi AS BIGINT)) AS n(i)"
        return (
            "WITH RECURSIVE n(i) AS (SELECT :lo UNION ALL SELECT i + 1 FROM n WHERE i < :hi) ",
            "n",
        )

    def _id(self, kind: int, number: str) -> str:
        # UUID-shaped and scattered like uuid4, so the indexes are as deep and
        # as fragmented as real ones, yet computable from the row number.
        if self.pg:
            return f"md5('{kind}-' || ({number}))::uuid::text"
        scattered = f"(({number}) * 2654435761) % 4294967296"
        return f"printf('%08x-0000-4000-800{kind}-%012x', {scattered}, {number})"

    def load(self, attempts: int) -> None:
        steps = max(1, attempts // ATTEMPTS_PER_BULK_STEP)
        runs = max(1, steps // STEPS_PER_BULK_RUN)
        attempts = steps * ATTEMPTS_PER_BULK_STEP
        prefix, series = self._series()
        r0, s0, h0 = self.runs, self.steps, self.attempts
        run_of_step = f":r0 + 1 + (i - :s0 - 1) % {runs}"
        step_of_attempt = f":s0 + 1 + (i - :h0 - 1) % {steps}"
        attempt_no = f"1 + (i - :h0 - 1) / {steps}"
        run_of_attempt = f":r0 + 1 + (({step_of_attempt}) - :s0 - 1) % {runs}"
        self._insert(
            "workflow_runs",
            f"{prefix}INSERT INTO workflow_runs (workflow_run_id, workflow, status, input) "
            f"SELECT {self._id(1, 'i')}, 'bench-bulk', 'completed', '{{}}' FROM {series}",
            {"lo": r0 + 1, "hi": r0 + runs},
        )
        self._insert(
            "workflow_step",
            f"{prefix}INSERT INTO workflow_step (workflow_step_id, workflow_run_id, "
            "step_name, status, result, current_attempt) "
            f"SELECT {self._id(2, 'i')}, {self._id(1, run_of_step)}, 'bulk-' || i, "
            f"'succeeded', '{{\"ok\": 1}}', {ATTEMPTS_PER_BULK_STEP} FROM {series}",
            {"lo": s0 + 1, "hi": s0 + steps, "r0": r0, "s0": s0},
        )
        for lo in range(h0 + 1, h0 + attempts + 1, BULK_CHUNK):
            self._insert(
                "workflow_step_history",
                f"{prefix}INSERT INTO workflow_step_history (history_id, workflow_run_id, "
                "workflow_step_id, status, attempt) "
                f"SELECT {self._id(3, 'i')}, {self._id(1, run_of_attempt)}, "
                f"{self._id(2, step_of_attempt)}, "
                f"CASE WHEN {attempt_no} = {ATTEMPTS_PER_BULK_STEP} "
                f"THEN 'succeeded' ELSE 'failed' END, {attempt_no} FROM {series}",
                {
                    "lo": lo,
                    "hi": min(lo + BULK_CHUNK - 1, h0 + attempts),
                    "r0": r0,
                    "s0": s0,
                    "h0": h0,
                },
            )
        self.runs, self.steps, self.attempts = r0 + runs, s0 + steps, h0 + attempts
        self._settle()

    def _settle(self) -> None:
        """Do now the work the load leaves behind, so it does not land in a measurement."""
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if not self.pg:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                return
            conn.exec_driver_sql("VACUUM ANALYZE")
            try:
                conn.exec_driver_sql("CHECKPOINT")
            except sa.exc.DBAPIError:
                # Needs superuser or pg_checkpoint; without it the server
                # writes the load out in the background, a little noisier.
                conn.rollback()

    def _insert(self, table: str, sql: str, params: dict[str, int]) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text(sql), params)
            if self.pg:
                # The foreign-key checks of the next load are planned from these
                # statistics: left at a table's small size, they can choose a
                # scan per inserted row, and a million-row load takes minutes.
                conn.exec_driver_sql(f"ANALYZE {table}")


def count_rows(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        history = conn.exec_driver_sql("SELECT count(*) FROM workflow_step_history").scalar()
        steps = conn.exec_driver_sql("SELECT count(*) FROM workflow_step").scalar()
    return int(history or 0), int(steps or 0)
