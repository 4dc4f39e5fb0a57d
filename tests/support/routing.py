"""Which partitions each statement the store sends would touch on a distributed database.

Three pieces, used by ``tests/integration/test_routing.py``:

- ``Catalogue``: every statement of ``pikku_celery.store.sql`` by its name
  (``module.attribute``; a builder such as ``attempts.record_attempt_pg`` is called
  for each of its known arguments), compiled for PostgreSQL, so an executed
  statement is known by name however its SQL text changes;
- ``StatementRecorder``: every statement an engine sends (``before_cursor_execute``),
  with its real parameters and its name;
- ``PartitionedCopy``: the schema in a database of its own with every distributed
  table (``pikku_celery.schema.distribution``) HASH-partitioned into 8 by its key, as
  Citus would split it; ``touched`` EXPLAINs a statement there with its parameters and
  says which partitions of each table the plan keeps after pruning.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import pkgutil
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final

import psycopg
import sqlalchemy as sa

import pikku_celery.store.sql as sql_package
from pikku_celery import WorkflowStore
from pikku_celery.schema import COMPAT_SCHEMA, metadata
from pikku_celery.schema.distribution import DISTRIBUTED, REFERENCE
from pikku_celery.store.dialect import PostgreSQL
from pikku_celery.store.sql.attempts import TIMESTAMP_COLUMN

__all__ = [
    "PARTITIONS",
    "Catalogue",
    "Execution",
    "PartitionedCopy",
    "StatementRecorder",
    "Touch",
    "carried_strings",
]

PARTITIONS: Final = 8

# Modules of store/sql that hold no statements.
_NOT_STATEMENTS: Final = {"spelling", "fan_out"}

_PG: Final = PostgreSQL()

#: What each builder's parameters are called with, by parameter name (a ``bool`` takes
#: both values). A builder with a parameter not here is left out, and what it builds
#: shows up as an unknown statement: add its values here.
ARGUMENTS: Final[dict[str, Sequence[Any]]] = {
    "insert": [_PG.insert],
    "clock": [_PG.clock],
    "among": [_PG.among],
    "typed": [lambda name, type_: sa.cast(sa.bindparam(name), type_)],
    "status": sorted(TIMESTAMP_COLUMN),
    "status_count": range(1, 8),
}


def _modules() -> Iterator[tuple[str, ModuleType]]:
    for info in pkgutil.iter_modules(sql_package.__path__):
        if info.name not in _NOT_STATEMENTS:
            yield info.name, importlib.import_module(f"{sql_package.__name__}.{info.name}")


def _calls(function: Callable[..., Any]) -> Iterator[tuple[Any, ...]] | None:
    """Every combination of known arguments, or None when a parameter is unknown."""
    choices: list[Sequence[Any]] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.default is not inspect.Parameter.empty:
            continue
        if parameter.name in ARGUMENTS:
            choices.append(ARGUMENTS[parameter.name])
        elif parameter.annotation in ("bool", bool):
            choices.append((False, True))
        else:
            return None
    return itertools.product(*choices)


class Catalogue:
    """Every statement of ``store/sql`` by name, as its object and its PostgreSQL text."""

    def __init__(self, dialect: sa.Dialect) -> None:
        self._dialect = dialect
        self.names: set[str] = set()
        self._by_id: dict[int, str] = {}
        self._by_text: dict[str, str] = {}
        self._kept: list[sa.Executable] = []  # alive, so their ids stay theirs
        #: Statements of two names that compile to one text (an executed one could be
        #: either): each text with its names.
        self.ambiguous: dict[str, set[str]] = {}
        for module_name, module in _modules():
            for attribute in getattr(module, "__all__", ()):
                value = getattr(module, attribute)
                name = f"{module_name}.{attribute}"
                if isinstance(value, sa.Executable):
                    self._add(name, value)
                elif inspect.isfunction(inspect.unwrap(value)):
                    for arguments in _calls(value) or ():
                        try:
                            built = value(*arguments)
                        except Exception:
                            continue  # a helper of statements, not a builder of one
                        if isinstance(built, sa.Executable):
                            self._add(name, built)

    def _text(self, statement: sa.Executable) -> str:
        return str(statement.compile(dialect=self._dialect))  # type: ignore[attr-defined]

    def _add(self, name: str, statement: sa.Executable) -> None:
        self.names.add(name)
        self._kept.append(statement)
        self._by_id.setdefault(id(statement), name)
        text = self._text(statement)
        first = self._by_text.setdefault(text, name)
        if first != name:
            self.ambiguous.setdefault(text, {first}).add(name)

    def adopt(self, objects: Iterable[Any]) -> None:
        """Statements built once elsewhere (a dialect's catalogue): known by their text."""
        for value in objects:
            if isinstance(value, sa.Executable) and id(value) not in self._by_id:
                name = self._by_text.get(self._text(value))
                if name is not None:
                    self._kept.append(value)
                    self._by_id[id(value)] = name

    def name_of(self, compiled: Any, text: str) -> str | None:
        if compiled is not None:
            statement = getattr(compiled, "statement", None)
            if statement is not None and id(statement) in self._by_id:
                return self._by_id[id(statement)]
            text = compiled.string
        return self._by_text.get(text)


@dataclass
class Execution:
    """One statement as it was sent: its name (None: not in the catalogue), its SQL
    and each parameter set (several for an ``executemany``)."""

    name: str | None
    text: str
    parameter_sets: list[Any]


class StatementRecorder:
    """Every statement an engine sends while recording, named by a catalogue."""

    def __init__(self, engine: sa.Engine, catalogue: Catalogue) -> None:
        self.engine = engine
        self.catalogue = catalogue
        self.executions: list[Execution] = []

    def _record(
        self,
        conn: Any,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        compiled = None if context is None else context.compiled
        name = self.catalogue.name_of(compiled, statement)
        sets = list(parameters) if executemany else [parameters]
        self.executions.append(Execution(name, statement, sets))

    @contextmanager
    def recording(self) -> Iterator[StatementRecorder]:
        sa.event.listen(self.engine, "before_cursor_execute", self._record)
        try:
            yield self
        finally:
            sa.event.remove(self.engine, "before_cursor_execute", self._record)


def carried_strings(parameters: Any) -> set[str]:
    """Every string a parameter set carries, inside lists and JSON documents too."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.add(value)
            if value.startswith(("[", "{")):
                try:
                    walk(json.loads(value))
                except ValueError:
                    pass
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(parameters)
    return found


@dataclass
class Touch:
    """What a statement's plan keeps: the partitions of each distributed table (by
    remainder), or why the partitioned layout refuses the statement."""

    partitions: dict[str, set[int]] = field(default_factory=dict)
    refused: str | None = None
    #: The plan locks the rows it reads (FOR UPDATE/SHARE): Citus takes such a
    #: statement only when it runs on one shard.
    locks: bool = False


_PARTITION: Final = re.compile(r"^(?P<table>.+)_p(?P<remainder>\d+)$")


def _walk(plan: Any, key: str) -> Iterator[Any]:
    """Every value of ``key`` in a JSON plan, at any depth."""
    if isinstance(plan, dict):
        for name, value in plan.items():
            if name == key:
                yield value
            else:
                yield from _walk(value, key)
    elif isinstance(plan, list):
        for item in plan:
            yield from _walk(item, key)


class PartitionedCopy:
    """The store's schema in a database of its own, each distributed table split by
    HASH into ``PARTITIONS`` by its key, where statements are planned, never run."""

    def __init__(self, url: str) -> None:
        store = WorkflowStore(url)
        store.init()
        store.close()
        self.conninfo = (
            sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        self._conn = psycopg.connect(self.conninfo, autocommit=True, prepare_threshold=None)
        self._split()
        # A join of two tables split alike on their keys pairs partition with partition,
        # and drops the pairs one side has pruned, as Citus joins co-located shards.
        self._conn.execute("SET enable_partitionwise_join = on")
        self._conn.execute("SET enable_partitionwise_aggregate = on")
        self._remainders: dict[str, dict[str, int]] = {}

    def close(self) -> None:
        self._conn.close()

    def _split(self) -> None:
        c = self._conn
        c.execute(f'DROP SCHEMA IF EXISTS "{COMPAT_SCHEMA}" CASCADE')  # views of the tables
        indexes: dict[str, list[tuple[str, bool, list[str], str | None, str | None]]] = {}
        for table in DISTRIBUTED:
            # With the constraint an index holds, if any: an upsert names its key by the
            # constraint's name (``ON CONFLICT ON CONSTRAINT``), so the copy keeps it.
            indexes[table] = [
                (definition, unique, columns, constraint, kind)
                for definition, unique, columns, constraint, kind in c.execute(
                    """
                    SELECT pg_get_indexdef(i.indexrelid), i.indisunique,
                           array(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(n, o)
                                 JOIN pg_attribute a
                                   ON a.attrelid = i.indrelid AND a.attnum = k.n
                                 ORDER BY k.o),
                           con.conname, con.contype
                    FROM pg_index i
                    LEFT JOIN pg_constraint con
                      ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
                    WHERE i.indrelid = %s::regclass
                    """,
                    (table,),
                ).fetchall()
            ]
        for table in DISTRIBUTED:
            c.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_flat"')
        for table, key in DISTRIBUTED.items():
            c.execute(
                f'CREATE TABLE "{table}" (LIKE "{table}_flat" INCLUDING DEFAULTS '
                f'INCLUDING GENERATED INCLUDING IDENTITY) PARTITION BY HASH ("{key}")'
            )
            for remainder in range(PARTITIONS):
                c.execute(
                    f'CREATE TABLE "{table}_p{remainder}" PARTITION OF "{table}" '
                    f"FOR VALUES WITH (MODULUS {PARTITIONS}, REMAINDER {remainder})"
                )
        for table in DISTRIBUTED:
            c.execute(f'DROP TABLE "{table}_flat" CASCADE')
        for table, key in DISTRIBUTED.items():
            for definition, unique, columns, constraint, kind in indexes[table]:
                if constraint is not None and key in columns:
                    c.execute(
                        f'ALTER TABLE "{table}" ADD CONSTRAINT "{constraint}" '
                        f"{'PRIMARY KEY' if kind == 'p' else 'UNIQUE'} "
                        f"({', '.join(f'{column}' for column in columns)})"
                    )
                    continue
                if unique and key not in columns:
                    # Citus, like a partitioned table, can keep no unique key without the
                    # distribution key: the index stays, not its uniqueness, and an ON
                    # CONFLICT that names it is refused here as it would be there.
                    definition = definition.replace("CREATE UNIQUE INDEX", "CREATE INDEX", 1)
                c.execute(definition)

    def remainders(self, table: str, values: Iterable[str]) -> dict[str, int]:
        """The partition (remainder) of ``table`` each key value falls in, as PostgreSQL
        hashes it (Citus hashes otherwise, into other shards, but alike: one key value, one
        place)."""
        known = self._remainders.setdefault(table, {})
        wanted = sorted(set(values) - set(known))
        if wanted:
            rows = self._conn.execute(
                "SELECT v, r FROM unnest(%s::text[]) v, generate_series(0, %s) r "
                "WHERE satisfies_hash_partition(%s::regclass, %s, r, v)",
                (wanted, PARTITIONS - 1, table, PARTITIONS),
            ).fetchall()
            known.update({value: remainder for value, remainder in rows})
        return known

    def touched(self, text: str, parameters: Any) -> Touch:
        """EXPLAIN (no ANALYZE: nothing runs) with the real parameters: the partitions of
        each distributed table left after plan-time pruning (those the executor prunes
        at start are shown as removed subplans, and not named)."""
        try:
            [[plan]] = self._conn.execute(f"EXPLAIN (FORMAT JSON) {text}", parameters).fetchall()
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return Touch(refused=first)
        touch = Touch(locks="LockRows" in _walk(plan, "Node Type"))
        for relation in _walk(plan, "Relation Name"):
            match = _PARTITION.match(relation)
            if match and match["table"] in DISTRIBUTED:
                touch.partitions.setdefault(match["table"], set()).add(int(match["remainder"]))
        return touch


def unclassified_tables() -> set[str]:
    """Tables of the schema that are neither distributed nor reference tables."""
    return set(metadata.tables) ^ (set(DISTRIBUTED) | set(REFERENCE))


def missing_keys() -> dict[str, str]:
    """Distributed tables whose key is not one of their columns."""
    return {
        table: key
        for table, key in DISTRIBUTED.items()
        if table in metadata.tables and key not in metadata.tables[table].c
    }
