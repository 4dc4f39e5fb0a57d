"""What the mirror's database says once a mirrored mode's session has ended.

Read with plain SQL on the tables of docs/data-contract.md, so that a wrong row cannot be
hidden by the store's own reading of it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sqlalchemy import create_engine, inspect, text

from bench.harness.workers import ROOT

__all__ = ["MirrorState", "OpenStep", "journal_report", "read_mirror"]

OPEN_STEP_STATUSES: Final = ("pending", "scheduled", "running", "lost")
OPEN_RUN_STATUSES: Final = ("running", "suspended")


@dataclass(frozen=True)
class OpenStep:
    step_id: str
    step_name: str
    task: str
    status: str
    attempt: int
    run_id: str
    run_status: str
    workflow: str
    created_at: float | None
    worker: str | None
    reason: str | None


@dataclass(frozen=True)
class OddRun:
    """A failed run none of whose steps failed: its error and its steps' statuses."""

    run_id: str
    workflow: str
    error: str
    step_statuses: dict[str, int]
    created_at: float | None


@dataclass
class MirrorState:
    runs: dict[str, int] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    open_steps: list[OpenStep] = field(default_factory=list)
    open_runs: dict[str, int] = field(default_factory=dict)  # by workflow
    failed_runs_no_failed_step: list[OddRun] = field(default_factory=list)
    redelivered_attempts: list[tuple[str, str, int, int, str]] = field(default_factory=list)
    step_ids: set[str] = field(default_factory=set)
    # The result backend's tables: results by status, chords by how far they got.
    results: dict[str, int] = field(default_factory=dict)
    result_groups: int = 0
    result_chords: dict[str, int] = field(default_factory=dict)


def _moment(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        moment = value
    else:
        moment = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp()


def _error_text(value: Any) -> str:
    if value is None:
        return ""
    document = value if isinstance(value, dict) else json.loads(value)
    if isinstance(document, dict):
        return f"{document.get('type')}: {document.get('message')}"
    return str(document)


def _engine_url(url: str) -> str:
    # As pikku-celery reads its URLs: PostgreSQL through psycopg 3. (Not imported from the
    # package: the mode may have run a snapshot of it, and the work tree may be mid-edit.)
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def read_mirror(url: str) -> MirrorState:
    engine = create_engine(_engine_url(url))
    state = MirrorState()
    try:
        with engine.connect() as conn:

            def by_status(table: str, column: str = "status") -> dict[str, int]:
                rows = conn.execute(text(f"SELECT {column}, count(*) FROM {table} GROUP BY 1"))
                return {str(key): int(n) for key, n in rows}

            state.runs = by_status("workflow_runs")
            state.steps = by_status("workflow_step")
            state.attempts = by_status("workflow_step_history")
            state.reasons = by_status("workflow_step_history", "reason")
            state.step_ids = {
                str(row[0])
                for row in conn.execute(text("SELECT workflow_step_id FROM workflow_step"))
            }
            rows = conn.execute(
                text(
                    "SELECT s.workflow_step_id, s.step_name, s.rpc_name, s.status,"
                    " s.current_attempt, r.workflow_run_id, r.status, r.workflow, s.created_at,"
                    " h.worker, h.reason"
                    " FROM workflow_step s"
                    " JOIN workflow_runs r ON r.workflow_run_id = s.workflow_run_id"
                    " LEFT JOIN workflow_step_history h"
                    "  ON h.workflow_step_id = s.workflow_step_id AND h.attempt = s.current_attempt"
                    " WHERE s.status IN ('pending', 'scheduled', 'running', 'lost')"
                    " ORDER BY s.created_at"
                )
            )
            state.open_steps = [
                OpenStep(
                    step_id=str(row[0]),
                    step_name=str(row[1]),
                    task=str(row[2]),
                    status=str(row[3]),
                    attempt=int(row[4] or 0),
                    run_id=str(row[5]),
                    run_status=str(row[6]),
                    workflow=str(row[7]),
                    created_at=_moment(row[8]),
                    worker=None if row[9] is None else str(row[9]),
                    reason=None if row[10] is None else str(row[10]),
                )
                for row in rows
            ]
            rows = conn.execute(
                text(
                    "SELECT workflow, count(*) FROM workflow_runs"
                    " WHERE status IN ('running', 'suspended') GROUP BY 1 ORDER BY 2 DESC"
                )
            )
            state.open_runs = {str(name): int(n) for name, n in rows}
            odd = conn.execute(
                text(
                    "SELECT r.workflow_run_id, r.workflow, r.error, r.created_at"
                    " FROM workflow_runs r WHERE r.status = 'failed' AND NOT EXISTS ("
                    "  SELECT 1 FROM workflow_step s"
                    "  WHERE s.workflow_run_id = r.workflow_run_id AND s.status = 'failed')"
                    " ORDER BY r.created_at"
                )
            ).all()
            for run_id, workflow, error, created in odd:
                statuses = conn.execute(
                    text(
                        "SELECT status, count(*) FROM workflow_step"
                        " WHERE workflow_run_id = :run GROUP BY 1"
                    ),
                    {"run": run_id},
                )
                state.failed_runs_no_failed_step.append(
                    OddRun(
                        run_id=str(run_id),
                        workflow=str(workflow),
                        error=_error_text(error),
                        step_statuses={str(s): int(n) for s, n in statuses},
                        created_at=_moment(created),
                    )
                )
            rows = conn.execute(
                text(
                    "SELECT s.workflow_step_id, s.rpc_name, h.attempt, h.delivery_count, h.status"
                    " FROM workflow_step_history h"
                    " JOIN workflow_step s ON s.workflow_step_id = h.workflow_step_id"
                    " WHERE h.delivery_count > 1 ORDER BY h.created_at"
                )
            )
            state.redelivered_attempts = [
                (str(a), str(b), int(c), int(d), str(e)) for a, b, c, d, e in rows
            ]
            if inspect(conn).has_table("pikku_celery_results"):
                state.results = by_status("pikku_celery_results")
                state.result_groups = int(
                    conn.execute(text("SELECT count(*) FROM pikku_celery_groups")).scalar_one()
                )
                rows = conn.execute(
                    text(
                        "SELECT CASE WHEN fired_at IS NULL THEN 'not fired'"
                        " WHEN sent_at IS NULL THEN 'fired, body not sent'"
                        " ELSE 'fired and sent' END, count(*)"
                        " FROM pikku_celery_result_chords GROUP BY 1"
                    )
                )
                state.result_chords = {str(key): int(n) for key, n in rows}
    finally:
        engine.dispose()
    return state


def open_by_task(state: MirrorState) -> dict[str, int]:
    return dict(Counter(f"{s.task} ({s.status})" for s in state.open_steps).most_common())


def journal_report(url: str, journal_dir: Path, pythonpath: str, *, replay: bool) -> str:
    """``pikku-celery journal`` (with ``--replay``: it writes what the session left), run by
    the pikku-celery the mode ran (``pythonpath``)."""
    command = [
        sys.executable,
        "-m",
        "pikku_celery",
        "--database-url",
        url,
        "journal",
        "--journal-dir",
        str(journal_dir),
    ]
    if replay:
        command.append("--replay")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIKKU_")}
    env["PYTHONPATH"] = pythonpath
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    return (done.stdout + done.stderr).strip()
