"""How the store's tables are laid out on a Citus cluster, and the call that lays them out.

Every hot table is hash-distributed by the key its statements name: a run's
rows by ``workflow_run_id``, a result by ``task_id``, a group's and a chord's
rows by ``group_id``. The keys are all text and every distributed table is in
one co-location group, so the rows of one value of a key share a shard: a lone
task's run, step, attempts and result (all under its task id) are on one node,
and a run's foreign keys stay on its shard. ``workflow_versions`` is small and
read by every node: a reference table. The leases and the migration history are
the coordinator's own (local tables), as one process of the cluster takes a lease
at a time.

``distribute`` runs once, after ``pikku-celery db upgrade``, on the coordinator
(``pikku-celery db distribute``); a table already distributed is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import sqlalchemy as sa

from pikku_celery.errors import ConfigurationError

__all__ = [
    "DISTRIBUTED",
    "LOCAL_TABLES",
    "PLACEMENTS",
    "REFERENCE",
    "Placement",
    "distribute",
    "distributed_tables",
]


@dataclass(frozen=True, slots=True)
class Placement:
    """One table on Citus: ``distributed`` by ``column``, or a ``reference`` table."""

    table: str
    kind: Literal["distributed", "reference"]
    column: str | None = None


def _by(table: str, column: str) -> Placement:
    return Placement(table, "distributed", column)


#: In the order they are laid out: a table referenced by a foreign key before the table
#: that references it (Citus checks the key when it distributes the second).
PLACEMENTS: Final = (
    Placement("workflow_versions", "reference"),
    _by("workflow_runs", "workflow_run_id"),
    _by("workflow_step", "workflow_run_id"),
    # Keyed by their run first since revision 0013: a run's attempts and deliveries
    # share its shard, and an attempt's foreign key to its step stays on it.
    _by("workflow_step_history", "workflow_run_id"),
    _by("pikku_celery_deliveries", "workflow_run_id"),
    _by("pikku_celery_run_events", "workflow_run_id"),
    _by("pikku_celery_chords", "workflow_run_id"),
    _by("pikku_celery_results", "task_id"),
    _by("pikku_celery_groups", "group_id"),
    _by("pikku_celery_result_chords", "group_id"),
    _by("pikku_celery_result_chord_parts", "group_id"),
)

#: Kept on the coordinator alone.
LOCAL_TABLES: Final = ("pikku_celery_leases", "pikku_celery_alembic_version")

#: Each distributed table and the column its rows are split by (the routing test's copy
#: of the schema is HASH-partitioned by these).
DISTRIBUTED: Final = {p.table: str(p.column) for p in PLACEMENTS if p.kind == "distributed"}

#: The tables that are not split: copied to every node, or the coordinator's own.
REFERENCE: Final = frozenset(
    [p.table for p in PLACEMENTS if p.kind == "reference"] + ["pikku_celery_leases"]
)

# Every distributed table joins the first one's co-location group.
_FIRST: Final = next(p.table for p in PLACEMENTS if p.kind == "distributed")


def distributed_tables(connection: sa.Connection) -> dict[str, str]:
    """The tables of this database Citus already places, by name: their kind of placement."""
    rows = connection.exec_driver_sql(
        "SELECT logicalrelid::regclass::text, partmethod FROM pg_dist_partition"
    ).all()
    return {name: ("reference" if method == "n" else "distributed") for name, method in rows}


def distribute(engine: sa.Engine, *, shard_count: int | None = None) -> list[str]:
    """Lay the store's tables out on the Citus cluster ``engine`` points at (its coordinator).

    Returns the tables laid out now (none when all were already). Raises
    ``ConfigurationError`` when the database is not a Citus coordinator or the
    schema is not there yet.
    """
    if shard_count is not None and shard_count < 1:
        raise ConfigurationError(f"shard count must be at least 1, not {shard_count}")
    if engine.dialect.name != "postgresql":
        raise ConfigurationError(
            f"{engine.url.drivername} cannot be distributed: Citus is PostgreSQL; point "
            "--database-url (or PIKKU_DATABASE_URL) at the Citus coordinator"
        )
    with engine.begin() as connection:
        if not connection.exec_driver_sql(
            "SELECT 1 FROM pg_extension WHERE extname = 'citus'"
        ).first():
            raise ConfigurationError(
                f"{engine.url.database!r} has no citus extension: run `CREATE EXTENSION citus` "
                "in it on the coordinator and on every worker, add the workers with "
                "`SELECT citus_add_node('host', port)`, then run `pikku-celery db distribute` again"
            )
        present = set(sa.inspect(connection).get_table_names())
        missing = [p.table for p in PLACEMENTS if p.table not in present]
        if missing:
            raise ConfigurationError(
                f"tables {', '.join(missing)} are not there: run `pikku-celery db upgrade` "
                "first, then `pikku-celery db distribute`"
            )
        done = distributed_tables(connection)
        laid_out: list[str] = []
        if shard_count is not None:
            connection.execute(
                sa.text("SELECT set_config('citus.shard_count', :count, true)"),
                {"count": str(shard_count)},
            )
        for placement in PLACEMENTS:
            if placement.table in done:
                continue
            try:
                _place(connection, placement)
            except sa.exc.DBAPIError as exc:
                reason = str(exc.orig).strip().splitlines()[0]
                raise ConfigurationError(
                    f"Citus refused to distribute {placement.table} ({reason}); nothing was "
                    "distributed. Bring the schema to this version's with `pikku-celery db "
                    "upgrade`, distribute a table of your own that references one of these by "
                    "the same key, then run `pikku-celery db distribute` again"
                ) from exc
            laid_out.append(placement.table)
        return laid_out


def _place(connection: sa.Connection, placement: Placement) -> None:
    if placement.kind == "reference":
        connection.execute(
            sa.text("SELECT create_reference_table(:table)"), {"table": placement.table}
        )
        return
    connection.execute(
        sa.text("SELECT create_distributed_table(:table, :column, colocate_with => :colocate)"),
        {
            "table": placement.table,
            "column": placement.column,
            "colocate": "default" if placement.table == _FIRST else _FIRST,
        },
    )
