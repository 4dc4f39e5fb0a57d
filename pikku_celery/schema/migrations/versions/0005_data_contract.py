"""The data contract: values in forms Pikku reads, and text views of the JSON on PostgreSQL.

- SQLite: times become ISO-8601 UTC with their zone (``2026-12-01T07:09:14.822425Z``,
  they were naive), booleans the text ``'true'``/``'false'`` (they were ``0``/``1``).
- Both: ``retry_delay`` becomes a duration with its unit (``'180'`` -> ``'180s'``,
  ``'0.2'`` -> ``'200ms'``; it was bare seconds, which Pikku reads as milliseconds).
- PostgreSQL: schema ``pikku_compat`` with read-only views of the four tables under
  their own names, every JSON column as ``text``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from pikku_celery.errors import StoreError

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Written out rather than imported: a migration keeps the SQL it shipped with.

TIME_COLUMNS: Final = {
    "workflow_runs": ("created_at", "updated_at"),
    "workflow_step": ("created_at", "updated_at"),
    "workflow_step_history": (
        "created_at",
        "running_at",
        "scheduled_at",
        "succeeded_at",
        "failed_at",
        "eta",
    ),
    "workflow_versions": ("created_at",),
    "pikku_celery_deliveries": ("created_at",),
}
FLAG_COLUMNS: Final = ("inline", "deterministic")

_CREATE_SCHEMA: Final = "CREATE SCHEMA IF NOT EXISTS pikku_compat"

# Simple views over one table would take writes and pass them on to it; Pikku's
# services do write, so a write must fail and say why instead of landing in our rows.
_REFUSE_WRITE: Final = """
CREATE FUNCTION pikku_compat.refuse_write() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    RAISE EXCEPTION '%.% is a read-only view of the tables pikku-celery writes',
        TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'read_only_sql_transaction',
        HINT = 'Write through pikku-celery (its store, or Celery tasks); Pikku services '
            'only read these views.';
END
$body$
"""

# Every column of the four tables at this revision, in order, each JSON column as text.
# The tables are named as revision 0001 made them: in the schema first on the path.
_RUNS_VIEW: Final = """
CREATE VIEW pikku_compat.workflow_runs AS SELECT
    workflow_run_id, workflow, status,
    CAST(input AS text) AS input, CAST(output AS text) AS output,
    CAST(error AS text) AS error, CAST(state AS text) AS state,
    inline, graph_hash, deterministic,
    CAST(planned_steps AS text) AS planned_steps, CAST(wire AS text) AS wire,
    created_at, updated_at
FROM workflow_runs
"""
_STEPS_VIEW: Final = """
CREATE VIEW pikku_compat.workflow_step AS SELECT
    workflow_step_id, workflow_run_id, step_name, rpc_name,
    CAST(data AS text) AS data, status,
    CAST(result AS text) AS result, CAST(error AS text) AS error,
    child_run_id, branch_taken, retries, retry_delay, from_step_name, current_attempt,
    created_at, updated_at
FROM workflow_step
"""
_HISTORY_VIEW: Final = """
CREATE VIEW pikku_compat.workflow_step_history AS SELECT
    history_id, workflow_step_id, status,
    CAST(result AS text) AS result, CAST(error AS text) AS error,
    attempt, created_at, running_at, scheduled_at, succeeded_at, failed_at,
    task_id, worker, pid, delivery_count, eta, reason
FROM workflow_step_history
"""
_VERSIONS_VIEW: Final = """
CREATE VIEW pikku_compat.workflow_versions AS SELECT
    workflow_name, graph_hash, CAST(graph AS text) AS graph, source, status, created_at
FROM workflow_versions
"""
_RUNS_READ_ONLY: Final = (
    "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_runs FOR EACH ROW EXECUTE FUNCTION pikku_compat.refuse_write()"
)
_STEPS_READ_ONLY: Final = (
    "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_step FOR EACH ROW EXECUTE FUNCTION pikku_compat.refuse_write()"
)
_HISTORY_READ_ONLY: Final = (
    "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_step_history FOR EACH ROW "
    "EXECUTE FUNCTION pikku_compat.refuse_write()"
)
_VERSIONS_READ_ONLY: Final = (
    "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_versions FOR EACH ROW EXECUTE FUNCTION pikku_compat.refuse_write()"
)
# What the downgrade may drop: our four views and our trigger function, nothing else. A
# Pikku service connected with ``search_path=pikku_compat`` may have made tables of its
# own in the schema (``channels``, ``channel_subscriptions``); those are never dropped.
_OURS: Final = (
    "workflow_runs",
    "workflow_step",
    "workflow_step_history",
    "workflow_versions",
    "refuse_write",
)
_OTHERS_IN_SCHEMA: Final = sa.text(
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = 'pikku_compat' AND c.relkind IN ('r', 'v', 'm', 'S', 'f', 'p')"
    " AND c.relname <> ALL(:ours)"
    " UNION ALL SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
    " WHERE n.nspname = 'pikku_compat' AND p.proname <> ALL(:ours)"
    " ORDER BY 1"
).bindparams(sa.bindparam("ours", value=list(_OURS), type_=postgresql.ARRAY(sa.Text)))
_DROP_VIEWS: Final = (
    "DROP VIEW IF EXISTS pikku_compat.workflow_runs",
    "DROP VIEW IF EXISTS pikku_compat.workflow_step",
    "DROP VIEW IF EXISTS pikku_compat.workflow_step_history",
    "DROP VIEW IF EXISTS pikku_compat.workflow_versions",
    "DROP FUNCTION IF EXISTS pikku_compat.refuse_write()",
)
_DROP_SCHEMA: Final = "DROP SCHEMA IF EXISTS pikku_compat"

_DATE_TIME: Final = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"
_CLOCK: Final = "[0-9][0-9]:[0-9][0-9]:[0-9][0-9]"
_NOT_DIGITS: Final = "*[^0-9]*"

_BARE_SECONDS: Final = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*")
_WITH_UNIT: Final = re.compile(r"(\d+)(s|ms)")


def _duration(milliseconds: int) -> str:
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


def _up_delay(old: str) -> str | None:
    bare = _BARE_SECONDS.fullmatch(old)
    return None if bare is None else _duration(round(float(bare.group(1)) * 1000))


def _down_delay(new: str) -> str | None:
    match = _WITH_UNIT.fullmatch(new)
    if match is None:
        return None
    amount = int(match.group(1))
    if match.group(2) == "s":
        return str(amount)
    return str(amount // 1000) if amount % 1000 == 0 else str(amount / 1000)


_steps = sa.table("workflow_step", sa.column("retry_delay", sa.Text))


def _convert_delays(convert: Callable[[str], str | None]) -> None:
    # A few distinct values however many steps: converted one value at a time.
    conn = op.get_bind()
    delay = _steps.c.retry_delay
    values = conn.execute(sa.select(delay).distinct().where(delay.is_not(None))).scalars()
    for old in list(values):
        new = convert(old)
        if new is not None and new != old:
            conn.execute(sa.update(_steps).where(delay == old).values(retry_delay=new))


def _glob(column: sa.ColumnElement[str], pattern: str) -> sa.ColumnElement[bool]:
    return column.op("GLOB")(pattern)


def _sqlite_times(up: bool) -> None:
    conn = op.get_bind()
    f = sa.func
    for name, columns in TIME_COLUMNS.items():
        table = sa.table(name, *(sa.column(c, sa.Text) for c in columns))
        for c in table.c:
            if up:
                # Naive, either separator, any fraction (or none): to T, 6 digits and Z.
                fraction = f.substr(c, 21)
                exact = sa.and_(
                    _glob(c, f"{_DATE_TIME}[ T]{_CLOCK}*"),
                    sa.or_(
                        f.length(c) == 19,
                        sa.and_(
                            f.substr(c, 20, 1) == ".",
                            f.length(c) > 20,
                            sa.not_(_glob(fraction, _NOT_DIGITS)),
                        ),
                    ),
                )
                value = f.substr(c, 1, 10) + "T" + f.substr(c, 12, 8) + "."
                value = value + f.substr(fraction + "000000", 1, 6) + "Z"
            else:
                # Back to SQLAlchemy's naive form: a space, 6 digits, no zone.
                fraction = f.substr(c, 21, f.max(f.length(c) - 21, 0))
                exact = sa.and_(
                    _glob(c, f"{_DATE_TIME}T{_CLOCK}*Z"),
                    sa.or_(
                        f.length(c) == 20,
                        sa.and_(
                            f.substr(c, 20, 1) == ".",
                            f.length(c) > 21,
                            sa.not_(_glob(fraction, _NOT_DIGITS)),
                        ),
                    ),
                )
                value = f.substr(c, 1, 10) + " " + f.substr(c, 12, 8) + "."
                value = value + f.substr(fraction + "000000", 1, 6)
            conn.execute(sa.update(table).where(exact).values({c.name: value}))


def _sqlite_flags(up: bool) -> None:
    conn = op.get_bind()
    runs = sa.table("workflow_runs", *(sa.column(c) for c in FLAG_COLUMNS))
    for c in runs.c:
        if up:
            where: sa.ColumnElement[bool] = sa.func.typeof(c).in_(["integer", "real"])
            value: sa.ColumnElement[object] = sa.case((c != 0, "true"), else_="false")
        else:
            where = sa.func.typeof(c) == "text"
            spelled_true = sa.func.lower(sa.func.trim(c)).in_(["true", "t", "1", "yes", "y", "on"])
            value = sa.case((spelled_true, 1), else_=0)
        conn.execute(sa.update(runs).where(where).values({c.name: value}))


def _compat_views() -> None:
    op.execute(_CREATE_SCHEMA)
    op.execute(_REFUSE_WRITE)
    op.execute(_RUNS_VIEW)
    op.execute(_STEPS_VIEW)
    op.execute(_HISTORY_VIEW)
    op.execute(_VERSIONS_VIEW)
    op.execute(_RUNS_READ_ONLY)
    op.execute(_STEPS_READ_ONLY)
    op.execute(_HISTORY_READ_ONLY)
    op.execute(_VERSIONS_READ_ONLY)


def _drop_compat_views() -> None:
    others = list(op.get_bind().execute(_OTHERS_IN_SCHEMA).scalars())
    if others:
        raise StoreError(
            "pikku_compat holds objects pikku-celery did not make ("
            + ", ".join(others)
            + "); they belong to another service, so this downgrade will not drop the "
            "schema. Move them out of pikku_compat (ALTER TABLE ... SET SCHEMA public), "
            "then run the downgrade again."
        )
    for statement in _DROP_VIEWS:
        op.execute(statement)
    op.execute(_DROP_SCHEMA)


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        _sqlite_times(up=True)
        _sqlite_flags(up=True)
    _convert_delays(_up_delay)
    if dialect == "postgresql":
        _compat_views()


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        _drop_compat_views()
    _convert_delays(_down_delay)
    if dialect == "sqlite":
        _sqlite_flags(up=False)
        _sqlite_times(up=False)
