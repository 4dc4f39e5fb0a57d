"""One run of the Celery benchmark: what it measured, and what the mirror recorded of it."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from bench.harness.cpu import PARTS
from bench.harness.timing import quantile
from bench.throughput.app import ATTEMPTS, WARMUP_TASKS


def run_key_sql(column: str, dialect: str) -> str:
    """SQL for the first task argument (the run key) stored in a JSON column."""
    if dialect == "sqlite":
        return f"json_extract({column}, '$.args[0]')"
    return f"{column} -> 'args' ->> 0"


def clear_mirror(url: str) -> None:
    """Empty the mirror's tables, so each run's polls scan only its own rows."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            names = set(sa.inspect(conn).get_table_names())
            tables = [
                name
                for name in ("workflow_step_history", "workflow_step", "workflow_runs")
                if name in names
            ]
            if tables:
                conn.exec_driver_sql(f"TRUNCATE {', '.join(tables)} CASCADE")
    finally:
        engine.dispose()


# --- what one run measured ----------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """The mirror's own account of one timed run, summed over its processes."""

    available: bool
    processes: int
    appended: int = 0
    written: int = 0
    batches: int = 0
    lags: tuple[float, ...] = ()

    def lag(self, q: float) -> float | None:
        return quantile(self.lags, q)


def load_delivery(folder: Path) -> Delivery:
    records = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
    if not records or any(record["total"] is None for record in records):
        return Delivery(False, len(records))
    appended = written = batches = 0
    lags: list[float] = []
    for record in records:
        total, mark = record["total"], record["mark"]
        if mark is None:  # this process saw no task of the timed run
            mark = {"appended": 0, "written": 0, "batches": 0, "lags": []}
        appended += total["appended"] - mark["appended"]
        written += total["written"] - mark["written"]
        batches += total["batches"] - mark["batches"]
        # The lags of the events written since the mark: the newest ones (the mirror may
        # keep only its latest lags, so count from the end).
        since = min(total["written"] - mark["written"], len(total["lags"]))
        lags.extend(total["lags"][len(total["lags"]) - since :] if since > 0 else [])
    return Delivery(True, len(records), appended, written, batches, tuple(lags))


@dataclass(frozen=True)
class Run:
    scenario: str
    variant: str
    pool: str
    tasks: int
    elapsed: float
    worker_elapsed: float
    publish: float
    cpu: dict[str, float]
    #: SQL commits in the scenario's PostgreSQL database over the worker's life.
    commits: int | None = None
    delivery: Delivery | None = None
    check: str | None = None

    @property
    def rate(self) -> float:
        return self.tasks / self.elapsed

    @property
    def settle(self) -> float:
        """How long after the worker's last task SQL showed every step succeeded."""
        return self.elapsed - self.worker_elapsed

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds per task the bench's own processes spent (not "other")."""
        own = sum(self.cpu.get(name, 0.0) for name in PARTS if name != "other")
        return own / self.tasks * 1000

    @property
    def ceiling(self) -> float:
        """Tasks per second with every CPU busy on this work alone: robust to outside load."""
        return (os.cpu_count() or 1) * 1000 / self.cpu_ms if self.cpu_ms else 0.0

    @property
    def commits_per_task(self) -> float | None:
        # The worker also ran the warm-up tasks.
        return None if self.commits is None else self.commits / (self.tasks + WARMUP_TASKS)

    @property
    def batches_per_task(self) -> float | None:
        if self.delivery is None or not self.delivery.available:
            return None
        return self.delivery.batches / self.tasks


@dataclass
class MirrorCheck:
    steps: int
    succeeded: int
    attempts: Counter[str]
    runs_completed: int
    expected: int
    attempts_per_step: int

    @property
    def ok(self) -> bool:
        rows = sum(self.attempts.values())
        failed_ok = self.attempts["failed"] == self.expected * (self.attempts_per_step - 1)
        return (
            self.steps == self.succeeded == self.runs_completed == self.expected
            and self.attempts["succeeded"] == self.expected
            and rows == self.expected * self.attempts_per_step
            and failed_ok
        )

    def describe(self) -> str:
        rows = sum(self.attempts.values())
        by_status = ", ".join(
            f"{count} {status}" for status, count in sorted(self.attempts.items())
        )
        return (
            f"{self.succeeded}/{self.expected} steps, {rows} attempts ({by_status}), "
            f"{self.runs_completed} runs: {'ok' if self.ok else 'MISMATCH'}"
        )


def check_mirror(url: str, run: str, tasks: int, variant: str) -> MirrorCheck:
    """What the mirror recorded for one run's tasks (their first argument is the run key)."""
    engine = sa.create_engine(url)
    dialect = engine.dialect.name
    params = {"run": run}
    try:
        with engine.connect() as conn:
            steps, succeeded = conn.execute(
                sa.text(
                    "SELECT count(*), coalesce(sum(CASE WHEN status = 'succeeded' THEN 1 END), 0) "
                    f"FROM workflow_step WHERE {run_key_sql('data', dialect)} = :run"
                ),
                params,
            ).one()
            attempts = conn.execute(
                sa.text(
                    "SELECT h.status, count(*) FROM workflow_step_history h "
                    "JOIN workflow_step s ON s.workflow_step_id = h.workflow_step_id "
                    f"WHERE {run_key_sql('s.data', dialect)} = :run GROUP BY h.status"
                ),
                params,
            ).all()
            runs_completed = conn.execute(
                sa.text(
                    "SELECT count(*) FROM workflow_runs "
                    f"WHERE {run_key_sql('input', dialect)} = :run AND status = 'completed'"
                ),
                params,
            ).scalar_one()
    finally:
        engine.dispose()
    return MirrorCheck(
        steps=steps,
        succeeded=succeeded,
        attempts=Counter({status: count for status, count in attempts}),
        runs_completed=runs_completed,
        expected=tasks,
        attempts_per_step=ATTEMPTS[variant],
    )
