"""The mirror's batch statements are ones a database distributed by run id can run.

Compiled for PostgreSQL and read as text: the shapes Citus refuses or cannot route
(bound parameters in ``ON CONFLICT DO UPDATE`` of ``INSERT ... SELECT``, a run's
completion reading another run's rows, a step or attempt moved without its run) are
absent. Which shards each statement really touches is measured elsewhere, with EXPLAIN.
"""

from __future__ import annotations

import re
from typing import Any, Final

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from pikku_celery.store.sql import attempts, batches

TRANSITION_STATUSES: Final = ("scheduled", "running", "succeeded", "failed", "cancelled")
BOUND: Final = re.compile(r"%\(\w+\)s")


_PG: Final = postgresql.dialect()  # type: ignore[no-untyped-call]


def _typed(name: str, type_: Any) -> Any:
    return sa.cast(sa.bindparam(name), type_)


def _pg(statement: Any) -> str:
    return str(statement.compile(dialect=_PG))


@pytest.mark.parametrize("status", TRANSITION_STATUSES)
def test_a_batchs_attempt_upsert_binds_nothing_in_its_conflict_clause(status: str) -> None:
    sql = _pg(batches.record_attempts_pg(status))
    assert "INSERT INTO workflow_step_history" in sql and "SELECT" in sql
    conflict = sql[sql.index("ON CONFLICT") :]
    assert "DO UPDATE" in conflict
    assert BOUND.findall(conflict) == []
    # The rows' values travel in the selected set; the conflict names the attempt's key,
    # which leads with the run (and ends with its day on the partitioned layout).
    assert "ON CONFLICT ON CONSTRAINT workflow_step_history_step_attempt_unique" in conflict


@pytest.mark.parametrize("status", TRANSITION_STATUSES)
def test_a_batchs_step_update_names_the_runs_of_its_steps(status: str) -> None:
    sql = _pg(batches.record_attempts_pg(status))
    update = sql[sql.index("UPDATE workflow_step") : sql.index("INSERT INTO")]
    assert "workflow_step.workflow_run_id = ANY (%(run_ids)s" in update
    assert "workflow_step.workflow_run_id = newest.run_id" in update


@pytest.mark.parametrize(
    "statement", [batches.complete_runs_pg, attempts.complete_run_if_done], ids=["pg", "sqlite"]
)
def test_a_runs_completion_reads_only_its_own_rows(statement: sa.Update) -> None:
    sql = _pg(statement)
    # Whether a chord's body is out is the chord row's flag, not a look at the body's step,
    # which may be in another run.
    assert "body_written" in sql
    assert "pikku_celery_chords.body_id" not in sql
    # Each look at the steps is tied to the run (or to a step already tied to it).
    for alias in re.findall(r"workflow_step AS (\w+)", sql):
        assert re.search(rf"{alias}\.workflow_run_id = \w+\.workflow_run_id", sql), alias


def test_a_write_addresses_its_step_by_its_run_and_never_looks_the_run_up_itself() -> None:
    """A caller that names only the step looks its run up first (``attempts.step_run``):
    a subquery inside the write (Citus refuses one in a COALESCE) would also send the
    write to every shard."""
    sql = _pg(attempts.record_attempt_pg("failed"))
    assert "workflow_step.workflow_run_id = %(run_id)s" in sql
    assert "coalesce(%(run_id)s" not in sql.lower()
    # The step's update reads no other row; the attempt row is selected once, beside its
    # step's row and by the step's key (where its run's day is), never by a lookup.
    assert "SELECT" not in _pg(attempts.record_attempt_step("failed"))
    assert sql.partition("INSERT INTO")[2].count("SELECT") == 1


def test_statements_that_move_one_step_or_attempt_name_its_run() -> None:
    for statement in (
        attempts.record_attempt_step("running"),
        attempts.record_attempt(postgresql.insert, _typed, "running"),
        attempts.record_attempt_pg("running"),
        batches.hand_over_attempt,
        batches.uncount_deliveries,
        batches.steps_present_pg,
    ):
        where = _pg(statement).partition("WHERE")[2] or _pg(statement)
        assert "workflow_run_id" in where, statement
