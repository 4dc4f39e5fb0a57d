"""The opt-in partitioned layout: the run tables RANGE-partitioned by ``run_day``.

On PostgreSQL the six tables that hold a run's rows (its run, steps, attempts, counted
deliveries, events and open chords) can be laid out as one partition a day, by the day
their run was made (``run_day``, revision 0016), so a day of history is retired by
dropping its partitions instead of deleting its rows: no dead tuples, no vacuum after.

PostgreSQL keeps a unique key of a partitioned table only with the partition key in it,
so every primary and unique key keeps its name and gets ``run_day`` at its end, and every
foreign key goes through ``run_day`` too (a run's rows all carry its day, so they stay
together). Each table also has a DEFAULT partition: a row of a day with no partition of
its own is kept there rather than refused, and reported.

``convert`` runs once, after ``pikku-celery db upgrade`` (``db upgrade --layout
partitioned``); ``make_days`` and ``drop_days`` are the layout's upkeep. The results
tables are not run-keyed and stay as they are.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

import sqlalchemy as sa

from pikku_celery.errors import LayoutUnavailable
from pikku_celery.schema import migrate
from pikku_celery.schema.tables import COMPAT_SCHEMA

__all__ = [
    "AHEAD_DAYS",
    "IS_PARTITIONED",
    "OPEN_RUN_STATUSES",
    "PARTITIONED_TABLES",
    "Conversion",
    "DroppedDay",
    "MadeDays",
    "check_dialect",
    "convert",
    "day_partition",
    "default_partition",
    "default_rows",
    "drop_days",
    "is_partitioned",
    "make_days",
    "partition_days",
    "retire_days",
]

logger = logging.getLogger(__name__)

#: The partitioned tables, a referenced table before the tables that reference it.
PARTITIONED_TABLES: Final = (
    "workflow_runs",
    "workflow_step",
    "workflow_step_history",
    "pikku_celery_deliveries",
    "pikku_celery_run_events",
    "pikku_celery_chords",
)
#: A run still being worked on: its day is never dropped.
OPEN_RUN_STATUSES: Final = ("running", "suspended")
#: The compat views that read these tables (revision 0005), made again after the change.
_VIEWS: Final = ("workflow_runs", "workflow_step", "workflow_step_history")
#: How many days after today always have partitions made ahead.
AHEAD_DAYS: Final = 2
#: How long dropping a day waits for the tables before leaving the day for later.
_LOCK_TIMEOUT: Final = "5s"
#: SQLSTATE: a lock not taken within ``lock_timeout``.
_LOCK_NOT_AVAILABLE: Final = "55P03"

_DAY_NAME: Final = re.compile(r"_p(\d{8})$")
_FOREIGN_KEY: Final = re.compile(
    r"FOREIGN KEY \((?P<cols>[^)]*)\) REFERENCES (?P<table>[\w.\"]+)\((?P<refs>[^)]*)\)(?P<rest>.*)"
)

# The day a row of each table belongs to, in the plain table ``t`` being copied: its run's
# day (the runs are copied first, into ``n``), or, for a delivery whose run is unknown
# (``''`` before revision 0013), its own day.
_UTC_DAY: Final = "(t.created_at AT TIME ZONE 'UTC')::date"


def day_partition(table: str, day: dt.date) -> str:
    """The name of ``table``'s partition of ``day``."""
    return f"{table}_p{day:%Y%m%d}"


def default_partition(table: str) -> str:
    return f"{table}_pdefault"


@dataclass(frozen=True, slots=True)
class Conversion:
    """What ``convert`` did: the rows it moved per table and the days it made."""

    already: bool
    rows: dict[str, int] = field(default_factory=dict)
    days: tuple[dt.date, ...] = ()

    def describe(self) -> str:
        if self.already:
            return "the tables are already partitioned by day; nothing changed"
        rows = ", ".join(f"{table} {count}" for table, count in self.rows.items())
        span = f"{self.days[0]} to {self.days[-1]}" if self.days else "none"
        return (
            f"partitioned {len(self.rows)} tables by run_day: {len(self.days)} day partitions "
            f"each ({span}) and a default one; rows kept: {rows}"
        )


@dataclass(frozen=True, slots=True)
class MadeDays:
    """What ``make_days`` did: the partitions made, and rows moved out of the defaults."""

    made: tuple[str, ...] = ()
    moved: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DroppedDay:
    """One day whose partitions were dropped, and how many rows each table lost."""

    day: dt.date
    rows: dict[str, int]


# --- reading the layout ----------------------------------------------------------------


#: Whether the store's tables are laid out by day (``workflow_runs`` stands for all six).
IS_PARTITIONED: Final = (
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_partitioned_table "
    "WHERE partrelid = to_regclass('workflow_runs'))"
)


def is_partitioned(connection: sa.Connection) -> bool:
    """The store's tables are laid out by day (``workflow_runs`` stands for all six)."""
    if connection.dialect.name != "postgresql":
        return False
    return bool(connection.exec_driver_sql(IS_PARTITIONED).scalar_one())


def partition_days(connection: sa.Connection, table: str = "workflow_runs") -> list[dt.date]:
    """The days ``table`` has a partition of, oldest first."""
    names = connection.execute(
        sa.text(
            "SELECT c.relname FROM pg_catalog.pg_inherits i "
            "JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:table)"
        ),
        {"table": table},
    ).scalars()
    days = []
    for name in names:
        match = _DAY_NAME.search(name)
        if match is not None:
            days.append(dt.datetime.strptime(match.group(1), "%Y%m%d").date())
    return sorted(days)


def default_rows(connection: sa.Connection) -> dict[str, int]:
    """The rows each table keeps in its default partition (a day that had none of its own);
    only tables that have some."""
    found = {}
    for table in PARTITIONED_TABLES:
        count = connection.execute(
            sa.select(sa.func.count()).select_from(sa.table(default_partition(table)))
        ).scalar_one()
        if count:
            found[table] = int(count)
    return found


def _today(connection: sa.Connection) -> dt.date:
    # The database's clock: every process that keeps the layout agrees on the day.
    day: dt.date = connection.exec_driver_sql(
        "SELECT (statement_timestamp() AT TIME ZONE 'UTC')::date"
    ).scalar_one()
    return day


# --- transactions ----------------------------------------------------------------------


@contextmanager
def _connected(bind: sa.Engine | sa.Connection) -> Iterator[sa.Connection]:
    """One transaction: the caller's when ``bind`` is a connection inside one (the caller
    commits), else one of its own committed at the end."""
    if isinstance(bind, sa.Engine):
        with bind.begin() as connection:
            yield connection
        return
    if bind.in_transaction():
        yield bind
        return
    with bind.begin():
        yield bind


def check_dialect(name: str) -> None:
    """Raise ``LayoutUnavailable`` unless a database of dialect ``name`` can be partitioned."""
    if name != "postgresql":
        raise LayoutUnavailable(
            f"the partitioned layout needs PostgreSQL; {name} keeps the plain layout (run "
            "`pikku-celery db upgrade` without --layout, and retire old runs with "
            "`pikku-celery prune --older-than 30d`, choosing the age)"
        )


def _check_can_partition(connection: sa.Connection) -> None:
    check_dialect(connection.dialect.name)
    distributed = connection.exec_driver_sql(
        "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"
    ).scalar_one()
    if (
        distributed
        and connection.exec_driver_sql(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition "
            "WHERE logicalrelid = to_regclass('workflow_runs'))"
        ).scalar_one()
    ):
        raise LayoutUnavailable(
            "the tables of this database are distributed by Citus (`pikku-celery db "
            "distribute`); the partitioned layout is for a single PostgreSQL server. Keep "
            "the distributed layout and retire old runs with "
            "`pikku-celery prune --older-than 30d`, choosing the age"
        )
    head = migrate.head_revision()
    revision = None
    if connection.execute(
        sa.text("SELECT to_regclass(:t) IS NOT NULL"), {"t": migrate.VERSION_TABLE}
    ).scalar_one():
        revision = connection.execute(
            sa.select(sa.column("version_num")).select_from(sa.table(migrate.VERSION_TABLE))
        ).scalar()
    if revision != head:
        raise LayoutUnavailable(
            f"the schema is at revision {revision or 'none'}, the partitioned layout needs "
            f"{head}: run `pikku-celery db upgrade` first (or `pikku-celery db upgrade "
            "--layout partitioned`, which does both)"
        )


def _require_partitioned(connection: sa.Connection) -> None:
    if not is_partitioned(connection):
        raise LayoutUnavailable(
            "the tables are not partitioned by day; run `pikku-celery db upgrade --layout "
            "partitioned` first"
        )


# --- converting ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Table:
    """What a plain table has that its partitioned successor must have again."""

    name: str
    columns: list[str]
    keys: list[tuple[str, str, list[str]]]  # name, PRIMARY KEY / UNIQUE, columns
    foreign_keys: list[tuple[str, str]]  # name, definition
    indexes: list[str]
    owner: str
    grants: list[str]


@dataclass(frozen=True, slots=True)
class _View:
    name: str
    definition: str
    triggers: list[str]
    owner: str
    grants: list[str]


def _read_table(connection: sa.Connection, table: str) -> _Table:
    columns = list(
        connection.execute(
            sa.text(
                "SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass(:t) "
                "AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
            ),
            {"t": table},
        ).scalars()
    )
    if "run_day" not in columns:
        raise LayoutUnavailable(
            f"{table} has no run_day column: run `pikku-celery db upgrade` first"
        )
    keys = [
        (name, "PRIMARY KEY" if kind == "p" else "UNIQUE", list(cols))
        for name, kind, cols in connection.execute(
            sa.text(
                "SELECT c.conname, c.contype, array(SELECT a.attname FROM unnest(c.conkey) "
                "WITH ORDINALITY k(n, o) JOIN pg_catalog.pg_attribute a ON a.attrelid = "
                "c.conrelid AND a.attnum = k.n ORDER BY k.o) FROM pg_catalog.pg_constraint c "
                "WHERE c.conrelid = to_regclass(:t) AND c.contype IN ('p', 'u') "
                "ORDER BY c.contype, c.conname"
            ),
            {"t": table},
        ).all()
    ]
    foreign_keys = [
        (str(name), str(definition))
        for name, definition in connection.execute(
            sa.text(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_catalog.pg_constraint "
                "WHERE conrelid = to_regclass(:t) AND contype = 'f' ORDER BY conname"
            ),
            {"t": table},
        ).all()
    ]
    indexes = []
    for definition in connection.execute(
        sa.text(
            "SELECT pg_get_indexdef(i.indexrelid) FROM pg_catalog.pg_index i "
            "WHERE i.indrelid = to_regclass(:t) AND NOT EXISTS (SELECT 1 FROM "
            "pg_catalog.pg_constraint c WHERE c.conindid = i.indexrelid) ORDER BY 1"
        ),
        {"t": table},
    ).scalars():
        if definition.startswith("CREATE UNIQUE INDEX"):
            raise LayoutUnavailable(
                f"{table} has a unique index outside a constraint ({definition}), which a "
                "table partitioned by day cannot keep; drop it (or make it a constraint) "
                "and run the conversion again"
            )
        indexes.append(definition)
    owner, grants = _owner_and_grants(connection, table)
    return _Table(table, columns, keys, foreign_keys, indexes, owner, grants)


def _owner_and_grants(connection: sa.Connection, relation: str) -> tuple[str, list[str]]:
    owner = connection.execute(
        sa.text(
            "SELECT pg_get_userbyid(relowner) FROM pg_catalog.pg_class WHERE oid = to_regclass(:r)"
        ),
        {"r": relation},
    ).scalar_one()
    grants = [
        f"GRANT {privilege} ON {relation} TO "
        f"{'PUBLIC' if grantee is None else _quoted(grantee)}"
        f"{' WITH GRANT OPTION' if grantable else ''}"
        for privilege, grantee, grantable in connection.execute(
            sa.text(
                "SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN NULL ELSE "
                "pg_get_userbyid(a.grantee) END, a.is_grantable "
                "FROM pg_catalog.pg_class c, aclexplode(c.relacl) a "
                "WHERE c.oid = to_regclass(:r) AND a.grantee <> c.relowner ORDER BY 1, 2"
            ),
            {"r": relation},
        ).all()
    ]
    return str(owner), grants


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _read_views(connection: sa.Connection) -> list[_View]:
    views = []
    for view in _VIEWS:
        name = f"{COMPAT_SCHEMA}.{view}"
        exists = connection.execute(
            sa.text("SELECT to_regclass(:v) IS NOT NULL"), {"v": name}
        ).scalar_one()
        if not exists:
            continue
        definition = connection.execute(
            sa.text("SELECT pg_get_viewdef(to_regclass(:v))"), {"v": name}
        ).scalar_one()
        triggers = list(
            connection.execute(
                sa.text(
                    "SELECT pg_get_triggerdef(oid) FROM pg_catalog.pg_trigger "
                    "WHERE tgrelid = to_regclass(:v) AND NOT tgisinternal ORDER BY tgname"
                ),
                {"v": name},
            ).scalars()
        )
        owner, grants = _owner_and_grants(connection, name)
        views.append(_View(name, str(definition), triggers, owner, grants))
    return views


def _copy_day(table: str) -> tuple[str, str]:
    """The FROM clause and the day expression copying ``table`` (as ``t``) takes."""
    if table == "workflow_runs":
        return "workflow_runs t", f"COALESCE(t.run_day, {_UTC_DAY})"
    if table == "pikku_celery_deliveries":
        # No foreign key: a delivery of an unknown run ('' before revision 0013) keeps its
        # own day; one of a known run goes with its run.
        return (
            f"{table} t LEFT JOIN {_new('workflow_runs')} r "
            "ON r.workflow_run_id = t.workflow_run_id",
            f"COALESCE(r.run_day, t.run_day, {_UTC_DAY})",
        )
    # Its foreign key to its run holds: every row has one, and takes that run's day.
    return (
        f"{table} t JOIN {_new('workflow_runs')} r ON r.workflow_run_id = t.workflow_run_id",
        "r.run_day",
    )


def _new(table: str) -> str:
    return f"{table}__by_day"


def convert(bind: sa.Engine | sa.Connection, *, today: dt.date | None = None) -> Conversion:
    """Lay the six run tables of a database at the head revision out by day, in one
    transaction, keeping every row; a database already laid out so is left as it is.

    Raises ``LayoutUnavailable`` on SQLite, on a Citus-distributed database, and when the
    schema is not at this version's head; nothing is changed then, nor when any statement
    fails.
    """
    with _connected(bind) as connection:
        _check_can_partition(connection)
        if is_partitioned(connection):
            return Conversion(already=True)
        try:
            return _convert(connection, today)
        except sa.exc.DBAPIError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
            raise LayoutUnavailable(
                f"PostgreSQL refused to partition the tables ({type(exc.orig).__name__}: "
                f"{reason}); nothing was changed. An object of your own that depends on "
                "them (a view, a foreign key) must be dropped first and made again after "
                "`pikku-celery db upgrade --layout partitioned`"
            ) from exc


def _convert(connection: sa.Connection, today: dt.date | None) -> Conversion:
    """The conversion itself, in ``connection``'s transaction."""
    # Writers wait for the change rather than write to a table about to go.
    for name in PARTITIONED_TABLES:
        connection.exec_driver_sql(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
    tables = [_read_table(connection, name) for name in PARTITIONED_TABLES]
    views = _read_views(connection)
    for view in views:
        connection.exec_driver_sql(f"DROP VIEW {view.name}")
    first_day = today if today is not None else _today(connection)
    days = sorted(
        set(
            connection.exec_driver_sql(
                f"SELECT DISTINCT COALESCE(t.run_day, {_UTC_DAY}) FROM workflow_runs t "
                f"UNION SELECT DISTINCT COALESCE(t.run_day, {_UTC_DAY}) "
                "FROM pikku_celery_deliveries t"
            ).scalars()
        )
        | {first_day + dt.timedelta(days=n) for n in range(AHEAD_DAYS + 1)}
    )
    rows: dict[str, int] = {}
    for table in tables:
        _make_parent(connection, table, days)
        before = connection.exec_driver_sql(f"SELECT count(*) FROM {table.name}").scalar_one()
        source, day = _copy_day(table.name)
        columns = [c for c in table.columns if c != "run_day"]
        listed = ", ".join(columns)
        copied = connection.exec_driver_sql(
            f"INSERT INTO {_new(table.name)} ({listed}, run_day) "
            f"SELECT {', '.join(f't.{c}' for c in columns)}, {day} FROM {source}"
        ).rowcount
        if copied != before:
            raise LayoutUnavailable(
                f"{table.name} has {before} rows but {copied} could be given a day (rows "
                "whose run is gone?); nothing was changed. Delete the rows whose "
                "workflow_run_id names no run, then run the conversion again"
            )
        rows[table.name] = int(copied)
    for table in reversed(tables):
        connection.exec_driver_sql(f"DROP TABLE {table.name}")
    for table in tables:
        connection.exec_driver_sql(f"ALTER TABLE {_new(table.name)} RENAME TO {table.name}")
        for name, kind, columns in table.keys:
            connection.exec_driver_sql(
                f"ALTER TABLE {table.name} ADD CONSTRAINT {name} {kind} "
                f"({', '.join([*columns, 'run_day'])})"
            )
        for definition in table.indexes:
            connection.exec_driver_sql(definition)
        _owned(connection, table.name, table.owner, table.grants)
    for table in tables:
        for name, definition in table.foreign_keys:
            connection.exec_driver_sql(
                f"ALTER TABLE {table.name} ADD CONSTRAINT {name} "
                f"{_through_run_day(table.name, definition)}"
            )
    for view in views:
        connection.exec_driver_sql(f"CREATE VIEW {view.name} AS {view.definition}")
        for trigger in view.triggers:
            connection.exec_driver_sql(trigger)
        _owned(connection, view.name, view.owner, view.grants)
    for table in tables:
        connection.exec_driver_sql(f"ANALYZE {table.name}")
    logger.info(
        "pikku-celery partitioned the run tables by day",
        extra={"action": "partitioned_layout", "rows": rows, "days": len(days)},
    )
    return Conversion(already=False, rows=rows, days=tuple(days))


def _make_parent(connection: sa.Connection, table: _Table, days: Sequence[dt.date]) -> None:
    new = _new(table.name)
    connection.exec_driver_sql(
        f"CREATE TABLE {new} (LIKE {table.name} INCLUDING DEFAULTS) PARTITION BY RANGE (run_day)"
    )
    connection.exec_driver_sql(f"ALTER TABLE {new} ALTER COLUMN run_day SET NOT NULL")
    for day in days:
        _make_partition(connection, new, table.name, day)
    connection.exec_driver_sql(
        f"CREATE TABLE {default_partition(table.name)} PARTITION OF {new} DEFAULT"
    )


def _make_partition(connection: sa.Connection, parent: str, table: str, day: dt.date) -> str:
    name = day_partition(table, day)
    connection.exec_driver_sql(
        f"CREATE TABLE {name} PARTITION OF {parent} "
        f"FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + dt.timedelta(days=1)).isoformat()}')"
    )
    return name


def _through_run_day(table: str, definition: str) -> str:
    match = _FOREIGN_KEY.fullmatch(definition)
    referred = None if match is None else match["table"].split(".")[-1].strip('"')
    if match is None or referred not in PARTITIONED_TABLES:
        raise LayoutUnavailable(
            f"{table} has a foreign key the partitioned layout cannot keep ({definition}); "
            "drop it and run the conversion again"
        )
    return (
        f"FOREIGN KEY ({match['cols']}, run_day) REFERENCES {referred}"
        f"({match['refs']}, run_day){match['rest']}"
    )


def _owned(connection: sa.Connection, relation: str, owner: str, grants: list[str]) -> None:
    current = connection.exec_driver_sql("SELECT current_user").scalar_one()
    if owner != current:
        connection.exec_driver_sql(f"ALTER TABLE {relation} OWNER TO {_quoted(owner)}")
    for grant in grants:
        connection.exec_driver_sql(grant)


# --- making days -----------------------------------------------------------------------


def make_days(bind: sa.Engine | sa.Connection, first: dt.date, last: dt.date) -> MadeDays:
    """Make the missing partitions of every day from ``first`` to ``last`` (both in), the
    runs' before the tables that reference them, in one transaction.

    Rows of such a day already kept in a default partition (written while the day had no
    partition) are moved into the new one: PostgreSQL makes no partition of a day its
    default partition holds rows of.
    """
    if last < first:
        return MadeDays()
    made: list[str] = []
    moved: dict[str, int] = {}
    with _connected(bind) as connection:
        _require_partitioned(connection)
        present = {table: set(partition_days(connection, table)) for table in PARTITIONED_TABLES}
        day = first
        while day <= last:
            missing = [table for table in PARTITIONED_TABLES if day not in present[table]]
            if missing:
                for table, count in _make_day(connection, day, missing).items():
                    moved[table] = moved.get(table, 0) + count
                made += [day_partition(table, day) for table in missing]
            day += dt.timedelta(days=1)
    if moved:
        logger.warning(
            "pikku-celery moved rows out of the default partitions into their day's: %s",
            moved,
            extra={"action": "partition_default_rows", "rows": moved},
        )
    return MadeDays(tuple(made), moved)


def _make_day(connection: sa.Connection, day: dt.date, missing: list[str]) -> dict[str, int]:
    """Make ``day``'s partitions of ``missing``; the rows of the day the defaults hold are
    taken out first (references before what they reference: a cascade takes nothing) and
    put back after (what is referenced first)."""
    moved: dict[str, int] = {}
    for table in reversed(missing):
        held = connection.execute(
            sa.text(f"SELECT count(*) FROM {default_partition(table)} WHERE run_day = :day"),
            {"day": day},
        ).scalar_one()
        if not held:
            continue
        keep = f"pikku_moving_{table}"
        connection.exec_driver_sql(f"CREATE TEMPORARY TABLE {keep} (LIKE {table}) ON COMMIT DROP")
        moved[table] = int(
            connection.execute(
                sa.text(
                    f"WITH gone AS (DELETE FROM {default_partition(table)} WHERE run_day = :day "
                    f"RETURNING *) INSERT INTO {keep} SELECT * FROM gone"
                ),
                {"day": day},
            ).rowcount
        )
    for table in missing:
        _make_partition(connection, table, table, day)
        if table in moved:
            connection.exec_driver_sql(f"INSERT INTO {table} SELECT * FROM pikku_moving_{table}")
            connection.exec_driver_sql(f"DROP TABLE pikku_moving_{table}")
    return moved


# --- dropping days ---------------------------------------------------------------------


def drop_days(
    bind: sa.Engine | sa.Connection,
    before: dt.date,
    *,
    statuses: Collection[str] | None = None,
) -> list[dt.date]:
    """Drop every day partition wholly before ``before``; returns the days dropped.

    See :func:`retire_days`, which also counts the rows each day held.
    """
    return [dropped.day for dropped in retire_days(bind, before, statuses=statuses)]


def retire_days(
    bind: sa.Engine | sa.Connection,
    before: dt.date,
    *,
    statuses: Collection[str] | None = None,
) -> list[DroppedDay]:
    """Detach and drop the partitions of every day before ``before``, of every table, the
    tables that reference another first, one transaction a day (each committed).

    A day whose runs include an open one (``running``, ``suspended``) is kept, and so,
    when ``statuses`` is given, is a day holding a run of any other status. Given a
    connection, it must not be inside a transaction: each day commits on it.
    """
    if isinstance(bind, sa.Connection) and bind.in_transaction():
        raise ValueError("drop_days commits a transaction a day: pass a connection outside one")
    dropped: list[DroppedDay] = []
    keep = set(OPEN_RUN_STATUSES)
    with _connected_outside(bind) as connection:
        with connection.begin():
            _require_partitioned(connection)
            days = [day for day in partition_days(connection) if day < before]
        for day in days:
            try:
                with connection.begin():
                    rows = _drop_day(connection, day, keep, statuses)
            except sa.exc.OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                    raise
                logger.warning(
                    "pikku-celery left the partitions of %s for later: the tables were busy",
                    day,
                    extra={"action": "partitions_busy", "day": str(day)},
                )
                continue
            if rows is not None:
                dropped.append(DroppedDay(day, rows))
    if dropped:
        logger.info(
            "pikku-celery dropped the partitions of %d days",
            len(dropped),
            extra={"action": "partitions_dropped", "days": [str(d.day) for d in dropped]},
        )
    return dropped


@contextmanager
def _connected_outside(bind: sa.Engine | sa.Connection) -> Iterator[sa.Connection]:
    if isinstance(bind, sa.Engine):
        with bind.connect() as connection:
            yield connection
        return
    yield bind


def _drop_day(
    connection: sa.Connection,
    day: dt.date,
    keep: set[str],
    statuses: Collection[str] | None,
) -> dict[str, int] | None:
    runs = day_partition("workflow_runs", day)
    if not _may_drop(connection, runs, keep, statuses):
        return None
    # Counted before any lock: nobody writes a day that has passed but to resume a run of
    # it, which the look again below catches; a count holds no writer up.
    present = [
        (table, day_partition(table, day))
        for table in reversed(PARTITIONED_TABLES)
        if connection.execute(
            sa.text("SELECT to_regclass(:p) IS NOT NULL"), {"p": day_partition(table, day)}
        ).scalar_one()
    ]
    rows = {
        table: int(connection.exec_driver_sql(f"SELECT count(*) FROM {partition}").scalar_one())
        for table, partition in present
    }
    # Detaching takes each table whole for a moment anyway; taken first, in the order the
    # store's writers take them (runs first), nobody starts or resumes a run of the day
    # between the look at its runs and the drop. Waiting is bounded: a day not taken in
    # time is left for the next pass rather than queue every writer behind it.
    connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
    for table in PARTITIONED_TABLES:
        connection.exec_driver_sql(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    if not _may_drop(connection, runs, keep, statuses):
        return None
    for table, partition in present:
        connection.exec_driver_sql(f"ALTER TABLE {table} DETACH PARTITION {partition}")
        connection.exec_driver_sql(f"DROP TABLE {partition}")
    return rows


def _may_drop(
    connection: sa.Connection, runs: str, keep: set[str], statuses: Collection[str] | None
) -> bool:
    """No run of the day's partition ``runs`` is open (nor, given ``statuses``, of another
    status): each a look that stops at the first such run."""
    blocking = sa.text(f"SELECT EXISTS (SELECT 1 FROM {runs} WHERE status = ANY(:statuses))")
    if connection.execute(blocking, {"statuses": sorted(keep)}).scalar_one():
        return False
    if statuses is None:
        return True
    other = sa.text(f"SELECT EXISTS (SELECT 1 FROM {runs} WHERE status <> ALL(:statuses))")
    return not connection.execute(other, {"statuses": sorted(statuses)}).scalar_one()
