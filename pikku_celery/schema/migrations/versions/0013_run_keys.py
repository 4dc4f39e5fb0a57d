"""Every key of the run-keyed tables leads with the run id, so a distributed database
(Citus) can keep each run's rows on one shard; the plain layout gets the same keys.

- ``workflow_step``: primary key ``(workflow_run_id, workflow_step_id)``; a plain index
  on the step id (no unique one: a distributed table cannot hold a constraint without
  its distribution column).
- ``workflow_step_history``: gains ``workflow_run_id`` (filled from its step); primary
  key ``(workflow_run_id, history_id)``, unique ``(workflow_run_id, workflow_step_id,
  attempt)``, foreign key ``(workflow_run_id, workflow_step_id)`` to its step.
- ``pikku_celery_deliveries``: gains ``workflow_run_id`` (``''`` for rows of before:
  nothing told their run); primary key ``(workflow_run_id, event_id)``.
- ``pikku_celery_run_events``: primary key ``(workflow_run_id, event_id)``.
- ``pikku_celery_chords``: gains ``body_written`` (filled from the steps); primary key
  ``(workflow_run_id, body_id)``, an index on the body id.

PostgreSQL changes the keys in place, and its ``pikku_compat`` view of the history shows
the new column at its end. SQLite cannot change a key in place: each table is made again
and its rows copied, children dropped before their parents (dropping a parent first
would delete the children's rows through their cascading foreign key).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import SchemaItem

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# Written out rather than imported: a migration keeps the SQL it shipped with.
TS = sa.DateTime(timezone=True)
JSON = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
FLAG = sa.Boolean()

_HISTORY_COLUMNS: Final = """
    history_id, workflow_step_id, status,
    CAST(result AS text) AS result, CAST(error AS text) AS error,
    attempt, created_at, running_at, scheduled_at, succeeded_at, failed_at,
    task_id, worker, pid, delivery_count, eta, reason, replaced_by"""
_HISTORY_VIEW_NOW: Final = (
    "CREATE OR REPLACE VIEW pikku_compat.workflow_step_history AS SELECT"
    f"{_HISTORY_COLUMNS}, workflow_run_id FROM workflow_step_history"
)
_HISTORY_VIEW_BEFORE: Final = (
    "CREATE VIEW pikku_compat.workflow_step_history AS SELECT"
    f"{_HISTORY_COLUMNS} FROM workflow_step_history"
)
_HISTORY_READ_ONLY: Final = (
    "CREATE TRIGGER read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON "
    "pikku_compat.workflow_step_history FOR EACH ROW "
    "EXECUTE FUNCTION pikku_compat.refuse_write()"
)
_FILL_HISTORY_RUN: Final = (
    "UPDATE workflow_step_history SET workflow_run_id = (SELECT s.workflow_run_id "
    "FROM workflow_step s WHERE s.workflow_step_id = workflow_step_history.workflow_step_id)"
)
# Downgrade: the old keys hold one row per step id and per delivery; the first written
# stays (a step's attempts go with a step dropped, through their foreign key).
_ONE_STEP_EACH: Final = (
    "DELETE FROM workflow_step s USING workflow_step t "
    "WHERE s.workflow_step_id = t.workflow_step_id AND (s.created_at, s.ctid) > "
    "(t.created_at, t.ctid)"
)
_ONE_DELIVERY_EACH: Final = (
    "DELETE FROM pikku_celery_deliveries d USING pikku_celery_deliveries e "
    "WHERE d.event_id = e.event_id AND d.ctid > e.ctid"
)
_FILL_BODY_WRITTEN: Final = (
    "UPDATE pikku_celery_chords SET body_written = true WHERE EXISTS (SELECT 1 "
    "FROM workflow_step s WHERE s.workflow_step_id = pikku_celery_chords.body_id)"
)


# --- the tables at each revision (SQLite makes them again) ---------------------------


def _step_table(meta: sa.MetaData, *, run_keyed: bool) -> sa.Table:
    key: list[SchemaItem] = (
        [
            sa.PrimaryKeyConstraint("workflow_run_id", "workflow_step_id", name="pk_workflow_step"),
            sa.Index("idx_workflow_step_id", "workflow_step_id"),
        ]
        if run_keyed
        else [sa.PrimaryKeyConstraint("workflow_step_id", name="pk_workflow_step")]
    )
    return sa.Table(
        "workflow_step",
        meta,
        sa.Column("workflow_step_id", sa.Text, nullable=False),
        sa.Column("workflow_run_id", sa.Text, nullable=False),
        sa.Column("step_name", sa.Text, nullable=False),
        sa.Column("rpc_name", sa.Text),
        sa.Column("data", JSON),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'pending'")),
        sa.Column("result", JSON),
        sa.Column("error", JSON),
        sa.Column("child_run_id", sa.Text),
        sa.Column("branch_taken", sa.Text),
        sa.Column("retries", sa.Integer),
        sa.Column("retry_delay", sa.Text),
        sa.Column("from_step_name", sa.Text),
        sa.Column("current_attempt", sa.Integer),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.current_timestamp()),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.current_timestamp()),
        sa.Column("routing", JSON),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.workflow_run_id"],
            name="fk_workflow_step_workflow_run_id_workflow_runs",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("workflow_run_id", "step_name", name="workflow_step_run_name_unique"),
        sa.Index("idx_workflow_step_run_status", "workflow_run_id", "status"),
        sa.Index(
            "idx_workflow_step_open",
            "status",
            "updated_at",
            sqlite_where=sa.text("status IN ('scheduled', 'running', 'lost')"),
        ),
        *key,
    )


def _history_table(meta: sa.MetaData, *, run_keyed: bool) -> sa.Table:
    key: list[SchemaItem]
    if run_keyed:
        key = [
            sa.Column("workflow_run_id", sa.Text, nullable=False),
            sa.PrimaryKeyConstraint(
                "workflow_run_id", "history_id", name="pk_workflow_step_history"
            ),
            sa.ForeignKeyConstraint(
                ["workflow_run_id", "workflow_step_id"],
                ["workflow_step.workflow_run_id", "workflow_step.workflow_step_id"],
                name="fk_workflow_step_history_step",
                ondelete="CASCADE",
            ),
            sa.UniqueConstraint(
                "workflow_run_id",
                "workflow_step_id",
                "attempt",
                name="workflow_step_history_step_attempt_unique",
            ),
            sa.Index(
                "idx_workflow_step_history_step",
                "workflow_run_id",
                "workflow_step_id",
                "created_at",
            ),
        ]
    else:
        key = [
            sa.PrimaryKeyConstraint("history_id", name="pk_workflow_step_history"),
            sa.ForeignKeyConstraint(
                ["workflow_step_id"],
                ["workflow_step.workflow_step_id"],
                name="fk_workflow_step_history_workflow_step_id_workflow_step",
                ondelete="CASCADE",
            ),
            sa.UniqueConstraint(
                "workflow_step_id", "attempt", name="workflow_step_history_step_attempt_unique"
            ),
            sa.Index("idx_workflow_step_history_step", "workflow_step_id", "created_at"),
        ]
    return sa.Table(
        "workflow_step_history",
        meta,
        sa.Column("history_id", sa.Text, nullable=False),
        sa.Column("workflow_step_id", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("result", JSON),
        sa.Column("error", JSON),
        sa.Column("attempt", sa.Integer),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.current_timestamp()),
        sa.Column("running_at", TS),
        sa.Column("scheduled_at", TS),
        sa.Column("succeeded_at", TS),
        sa.Column("failed_at", TS),
        sa.Column("task_id", sa.Text),
        sa.Column("worker", sa.Text),
        sa.Column("pid", sa.Integer),
        sa.Column("delivery_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("eta", TS),
        sa.Column("reason", sa.Text),
        sa.Column("replaced_by", sa.Text),
        *key,
    )


def _deliveries_table(meta: sa.MetaData, *, run_keyed: bool) -> sa.Table:
    key: list[SchemaItem] = (
        [
            sa.Column("workflow_run_id", sa.Text, nullable=False),
            sa.PrimaryKeyConstraint(
                "workflow_run_id", "event_id", name="pk_pikku_celery_deliveries"
            ),
        ]
        if run_keyed
        else [sa.PrimaryKeyConstraint("event_id", name="pk_pikku_celery_deliveries")]
    )
    return sa.Table(
        "pikku_celery_deliveries",
        meta,
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Index("idx_pikku_celery_deliveries_created", "created_at"),
        *key,
    )


def _events_table(meta: sa.MetaData, *, run_keyed: bool) -> sa.Table:
    key = ("workflow_run_id", "event_id") if run_keyed else ("event_id",)
    return sa.Table(
        "pikku_celery_run_events",
        meta,
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("workflow_run_id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("data", JSON),
        sa.Column("sent_at", TS, nullable=False),
        sa.Column("taken_by_step_id", sa.Text),
        sa.Column("taken_at", TS),
        sa.PrimaryKeyConstraint(*key, name="pk_pikku_celery_run_events"),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.workflow_run_id"],
            name="fk_pikku_celery_run_events_workflow_run_id_workflow_runs",
            ondelete="CASCADE",
        ),
        sa.Index("idx_pikku_celery_run_events_run_name", "workflow_run_id", "name", "sent_at"),
    )


def _chords_table(meta: sa.MetaData, *, run_keyed: bool) -> sa.Table:
    key: list[SchemaItem] = (
        [
            sa.Column("body_written", FLAG, nullable=False, server_default=sa.text("'false'")),
            sa.PrimaryKeyConstraint("workflow_run_id", "body_id", name="pk_pikku_celery_chords"),
            sa.Index("idx_pikku_celery_chords_body", "body_id"),
        ]
        if run_keyed
        else [
            sa.PrimaryKeyConstraint("body_id", name="pk_pikku_celery_chords"),
            sa.Index("idx_pikku_celery_chords_run", "workflow_run_id"),
        ]
    )
    return sa.Table(
        "pikku_celery_chords",
        meta,
        sa.Column("body_id", sa.Text, nullable=False),
        sa.Column("workflow_run_id", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.workflow_run_id"],
            name="fk_pikku_celery_chords_workflow_run_id_workflow_runs",
            ondelete="CASCADE",
        ),
        *key,
    )


_Shape = Callable[..., sa.Table]
#: Parents before children: made in this order, dropped in the reverse one.
_SHAPES: Final[tuple[_Shape, ...]] = (
    _step_table,
    _history_table,
    _deliveries_table,
    _events_table,
    _chords_table,
)


_Copy = Callable[[Callable[[str], sa.TableClause]], sa.Select[Any]]


def _sqlite_remake(*, run_keyed: bool, copies: dict[str, _Copy]) -> None:
    """Make the five tables again in the shape of one side of this revision.

    Each old table is renamed aside (its indexes dropped: their names are the new
    tables' too), the new ones made, the rows copied (``copies``: table -> the SELECT
    of its new columns from the old tables), and the old ones dropped, children first.
    """
    bind = op.get_bind()
    old_tables = _shaped(run_keyed=not run_keyed)
    for table in old_tables:
        for index in table.indexes:
            op.drop_index(str(index.name), table_name=table.name)
        op.rename_table(table.name, _OLD + table.name)

    def old(name: str) -> sa.TableClause:
        [table] = [t for t in old_tables if t.name == name]
        return sa.table(_OLD + name, *(sa.column(c.name) for c in table.columns))

    for table in _shaped(run_keyed=run_keyed):
        table.create(bind)
        columns = [c.name for c in table.columns]
        op.execute(sa.insert(table).from_select(columns, copies[table.name](old)))
    for table in reversed(old_tables):
        op.drop_table(_OLD + table.name)


_OLD: Final = "_old_"


def _shaped(*, run_keyed: bool) -> list[sa.Table]:
    """The five tables in one shape, parents first."""
    meta = sa.MetaData()
    # Their foreign keys name workflow_runs, which stays as it is.
    sa.Table("workflow_runs", meta, sa.Column("workflow_run_id", sa.Text, primary_key=True))
    for shape in _SHAPES:
        shape(meta, run_keyed=run_keyed)
    return [table for table in meta.sorted_tables if table.name != "workflow_runs"]


def _names(shape: _Shape, *, run_keyed: bool) -> list[str]:
    return [c.name for c in shape(sa.MetaData(), run_keyed=run_keyed).columns]


def _as_is(name: str, shape: _Shape, *, run_keyed: bool) -> _Copy:
    def copy(old: Callable[[str], sa.TableClause]) -> sa.Select[Any]:
        table = old(name)
        return sa.select(*(table.c[c] for c in _names(shape, run_keyed=run_keyed)))

    return copy


def _first_of_each(name: str, key: str, shape: _Shape) -> _Copy:
    """Downgrade: one row per ``key`` (the first written), as the old key allows."""

    def copy(old: Callable[[str], sa.TableClause]) -> sa.Select[Any]:
        table = old(name)
        rowid: sa.ColumnClause[Any] = sa.column("rowid")
        first = sa.select(sa.func.min(rowid)).select_from(table).group_by(table.c[key])
        return sa.select(*(table.c[c] for c in _names(shape, run_keyed=False))).where(
            rowid.in_(first)
        )

    return copy


def _history_with_runs(old: Callable[[str], sa.TableClause]) -> sa.Select[Any]:
    history, step = old("workflow_step_history"), old("workflow_step")
    run = (
        sa.select(step.c.workflow_run_id)
        .where(step.c.workflow_step_id == history.c.workflow_step_id)
        .scalar_subquery()
    )
    return sa.select(*(history.c[c] for c in _names(_history_table, run_keyed=False)), run)


def _deliveries_without_runs(old: Callable[[str], sa.TableClause]) -> sa.Select[Any]:
    # Nothing told these deliveries' runs: they keep protecting nothing, and go by age.
    table = old("pikku_celery_deliveries")
    return sa.select(table.c.event_id, table.c.created_at, sa.literal(""))


def _chords_with_flags(old: Callable[[str], sa.TableClause]) -> sa.Select[Any]:
    chord, step = old("pikku_celery_chords"), old("workflow_step")
    written = sa.exists().where(step.c.workflow_step_id == chord.c.body_id)
    return sa.select(
        chord.c.body_id,
        chord.c.workflow_run_id,
        chord.c.created_at,
        sa.case((written, sa.literal("true")), else_=sa.literal("false")),
    )


def _history_of_kept_steps(old: Callable[[str], sa.TableClause]) -> sa.Select[Any]:
    history = old("workflow_step_history")
    kept = sa.table("workflow_step", sa.column("workflow_step_id"), sa.column("workflow_run_id"))
    return sa.select(*(history.c[c] for c in _names(_history_table, run_keyed=False))).where(
        sa.exists().where(
            kept.c.workflow_step_id == history.c.workflow_step_id,
            kept.c.workflow_run_id == history.c.workflow_run_id,
        )
    )


def _deliveries_by_event(old: Callable[[str], sa.TableClause]) -> sa.Select[Any]:
    table = old("pikku_celery_deliveries")
    return sa.select(table.c.event_id, sa.func.min(table.c.created_at)).group_by(table.c.event_id)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_remake(
            run_keyed=True,
            copies={
                "workflow_step": _as_is("workflow_step", _step_table, run_keyed=True),
                "workflow_step_history": _history_with_runs,
                "pikku_celery_deliveries": _deliveries_without_runs,
                "pikku_celery_run_events": _as_is(
                    "pikku_celery_run_events", _events_table, run_keyed=True
                ),
                "pikku_celery_chords": _chords_with_flags,
            },
        )
        return
    _pg_upgrade()


def _pg_upgrade() -> None:
    # Steps: the history's foreign key goes first, it leans on the old key.
    op.drop_constraint(
        "fk_workflow_step_history_workflow_step_id_workflow_step",
        "workflow_step_history",
        type_="foreignkey",
    )
    op.drop_constraint("pk_workflow_step", "workflow_step", type_="primary")
    op.create_primary_key(
        "pk_workflow_step", "workflow_step", ["workflow_run_id", "workflow_step_id"]
    )
    op.create_index("idx_workflow_step_id", "workflow_step", ["workflow_step_id"])

    op.add_column("workflow_step_history", sa.Column("workflow_run_id", sa.Text))
    op.execute(_FILL_HISTORY_RUN)
    op.alter_column("workflow_step_history", "workflow_run_id", nullable=False)
    op.execute(_HISTORY_VIEW_NOW)
    op.drop_constraint("pk_workflow_step_history", "workflow_step_history", type_="primary")
    op.create_primary_key(
        "pk_workflow_step_history", "workflow_step_history", ["workflow_run_id", "history_id"]
    )
    op.drop_constraint(
        "workflow_step_history_step_attempt_unique", "workflow_step_history", type_="unique"
    )
    op.create_unique_constraint(
        "workflow_step_history_step_attempt_unique",
        "workflow_step_history",
        ["workflow_run_id", "workflow_step_id", "attempt"],
    )
    op.drop_index("idx_workflow_step_history_step", table_name="workflow_step_history")
    op.create_index(
        "idx_workflow_step_history_step",
        "workflow_step_history",
        ["workflow_run_id", "workflow_step_id", "created_at"],
    )
    op.create_foreign_key(
        "fk_workflow_step_history_step",
        "workflow_step_history",
        "workflow_step",
        ["workflow_run_id", "workflow_step_id"],
        ["workflow_run_id", "workflow_step_id"],
        ondelete="CASCADE",
    )

    op.add_column(
        "pikku_celery_deliveries",
        sa.Column("workflow_run_id", sa.Text, nullable=False, server_default=sa.text("''")),
    )
    op.alter_column("pikku_celery_deliveries", "workflow_run_id", server_default=None)
    _pg_key("pikku_celery_deliveries", "pk_pikku_celery_deliveries", "workflow_run_id", "event_id")
    _pg_key("pikku_celery_run_events", "pk_pikku_celery_run_events", "workflow_run_id", "event_id")

    op.add_column(
        "pikku_celery_chords",
        sa.Column("body_written", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.execute(_FILL_BODY_WRITTEN)
    _pg_key("pikku_celery_chords", "pk_pikku_celery_chords", "workflow_run_id", "body_id")
    op.drop_index("idx_pikku_celery_chords_run", table_name="pikku_celery_chords")
    op.create_index("idx_pikku_celery_chords_body", "pikku_celery_chords", ["body_id"])


def _pg_key(table: str, name: str, *columns: str) -> None:
    op.drop_constraint(name, table, type_="primary")
    op.create_primary_key(name, table, list(columns))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        # A step id written in two runs (which the old key refused) keeps one row: the
        # first, as the old key would have kept it; so does a chord held by two runs.
        _sqlite_remake(
            run_keyed=False,
            copies={
                "workflow_step": _first_of_each("workflow_step", "workflow_step_id", _step_table),
                "workflow_step_history": _history_of_kept_steps,
                "pikku_celery_deliveries": _deliveries_by_event,
                "pikku_celery_run_events": _as_is(
                    "pikku_celery_run_events", _events_table, run_keyed=False
                ),
                "pikku_celery_chords": _first_of_each(
                    "pikku_celery_chords", "body_id", _chords_table
                ),
            },
        )
        return
    # First, while the attempts' foreign key still takes them with their step.
    op.execute(_ONE_STEP_EACH)
    op.drop_index("idx_pikku_celery_chords_body", table_name="pikku_celery_chords")
    op.create_index("idx_pikku_celery_chords_run", "pikku_celery_chords", ["workflow_run_id"])
    op.execute(
        "DELETE FROM pikku_celery_chords c USING pikku_celery_chords d "
        "WHERE c.body_id = d.body_id AND c.ctid > d.ctid"
    )
    _pg_key("pikku_celery_chords", "pk_pikku_celery_chords", "body_id")
    op.drop_column("pikku_celery_chords", "body_written")
    _pg_key("pikku_celery_run_events", "pk_pikku_celery_run_events", "event_id")
    op.execute(_ONE_DELIVERY_EACH)
    _pg_key("pikku_celery_deliveries", "pk_pikku_celery_deliveries", "event_id")
    op.drop_column("pikku_celery_deliveries", "workflow_run_id")

    op.drop_constraint("fk_workflow_step_history_step", "workflow_step_history", type_="foreignkey")
    op.drop_index("idx_workflow_step_history_step", table_name="workflow_step_history")
    op.create_index(
        "idx_workflow_step_history_step",
        "workflow_step_history",
        ["workflow_step_id", "created_at"],
    )
    op.drop_constraint(
        "workflow_step_history_step_attempt_unique", "workflow_step_history", type_="unique"
    )
    op.create_unique_constraint(
        "workflow_step_history_step_attempt_unique",
        "workflow_step_history",
        ["workflow_step_id", "attempt"],
    )
    op.drop_constraint("pk_workflow_step_history", "workflow_step_history", type_="primary")
    op.create_primary_key("pk_workflow_step_history", "workflow_step_history", ["history_id"])
    # A view cannot lose a column in place: made again as revision 0008 left it.
    op.execute("DROP VIEW pikku_compat.workflow_step_history")
    op.execute(_HISTORY_VIEW_BEFORE)
    op.execute(_HISTORY_READ_ONLY)
    op.drop_column("workflow_step_history", "workflow_run_id")

    op.drop_index("idx_workflow_step_id", table_name="workflow_step")
    op.drop_constraint("pk_workflow_step", "workflow_step", type_="primary")
    op.create_primary_key("pk_workflow_step", "workflow_step", ["workflow_step_id"])
    op.create_foreign_key(
        "fk_workflow_step_history_workflow_step_id_workflow_step",
        "workflow_step_history",
        "workflow_step",
        ["workflow_step_id"],
        ["workflow_step_id"],
        ondelete="CASCADE",
    )
