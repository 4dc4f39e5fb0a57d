"""What the mirror wrote of a bench's run, read from its tables.

The Celery benches' tasks take the run's key as their first argument, so a
run's steps and runs are found by that key in the JSON the mirror stores.
Every read is rolled back: a poll adds nothing to the database's commits.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa

__all__ = [
    "MirrorCheck",
    "check_published",
    "check_run",
    "clear_mirror",
    "run_key_sql",
    "succeeded_steps",
    "wait_succeeded",
]

POLL: Final = 0.005


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


def succeeded_steps(engine: sa.Engine, run: str | None = None) -> int:
    """The steps SQL shows as succeeded: of run ``run``, or all."""
    where, params = "", {}
    if run is not None:
        where, params = f" AND {run_key_sql('data', engine.dialect.name)} = :r", {"r": run}
    with engine.connect() as conn:
        count = conn.execute(
            sa.text(f"SELECT count(*) FROM workflow_step WHERE status = 'succeeded'{where}"),
            params,
        ).scalar_one()
    return int(count)


def wait_succeeded(engine: sa.Engine, total: int, timeout: float, run: str | None = None) -> float:
    """The first time SQL shows ``total`` steps (of ``run``) succeeded."""
    deadline = time.monotonic() + timeout
    while (count := succeeded_steps(engine, run)) < total:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"{run or 'the bench'}: SQL shows {count}/{total} steps succeeded "
                f"after {timeout:.0f} s"
            )
        time.sleep(POLL)
    return time.time()


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


def check_run(url: str, run: str, tasks: int, attempts_per_step: int) -> MirrorCheck:
    """What the mirror recorded of a run's ``tasks`` tasks, each run ``attempts_per_step``
    times: a succeeded step, its attempts and a completed run each."""
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
        attempts_per_step=attempts_per_step,
    )


def check_published(url: str, run: str, calls: int) -> tuple[bool, str]:
    """What the mirror recorded of a run's published, never executed tasks: a step and a
    run each, every step scheduled (its message is out, no worker took it)."""
    engine = sa.create_engine(url)
    dialect = engine.dialect.name
    params = {"run": run}
    try:
        with engine.connect() as conn:
            statuses = Counter(
                {
                    str(status): int(count)
                    for status, count in conn.execute(
                        sa.text(
                            "SELECT status, count(*) FROM workflow_step "
                            f"WHERE {run_key_sql('data', dialect)} = :run GROUP BY status"
                        ),
                        params,
                    ).all()
                }
            )
            runs = int(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM workflow_runs "
                        f"WHERE {run_key_sql('input', dialect)} = :run"
                    ),
                    params,
                ).scalar_one()
            )
    finally:
        engine.dispose()
    ok = statuses == Counter({"scheduled": calls}) and runs == calls
    by_status = ", ".join(f"{count} {status}" for status, count in sorted(statuses.items()))
    return (
        ok,
        f"{calls} calls: {by_status or 'no steps'}, {runs} runs: {'ok' if ok else 'MISMATCH'}",
    )
