"""The Citus layout (``pikku_celery.schema.distribution``) against the tables as declared.

Citus refuses a distributed table whose primary key or unique constraint leaves out its
distribution column, and a foreign key between distributed tables that does not join
them on it; these hold the declared schema to that without a Citus cluster.
"""

from __future__ import annotations

import sqlalchemy as sa

from pikku_celery.schema import metadata
from pikku_celery.schema.distribution import LOCAL_TABLES, PLACEMENTS

_PLACED = {placement.table: placement for placement in PLACEMENTS}


def test_every_table_has_a_place_on_citus() -> None:
    declared = set(metadata.tables)
    assert declared - set(_PLACED) - set(LOCAL_TABLES) == set()
    assert set(_PLACED) <= declared
    assert not set(_PLACED) & set(LOCAL_TABLES)


def _unique_column_sets(table: sa.Table) -> list[set[str]]:
    sets = [set(table.primary_key.columns.keys())]
    sets += [
        set(constraint.columns.keys())
        for constraint in table.constraints
        if isinstance(constraint, sa.UniqueConstraint)
    ]
    sets += [set(index.columns.keys()) for index in table.indexes if index.unique]
    return sets


def test_every_key_of_a_distributed_table_holds_its_distribution_column() -> None:
    for placement in PLACEMENTS:
        if placement.kind != "distributed":
            continue
        table = metadata.tables[placement.table]
        assert placement.column is not None and placement.column in table.columns.keys()
        for columns in _unique_column_sets(table):
            assert placement.column in columns, (placement.table, columns)


def test_foreign_keys_join_distributed_tables_on_their_distribution_columns() -> None:
    for placement in PLACEMENTS:
        table = metadata.tables[placement.table]
        for key in table.foreign_key_constraints:
            target = _PLACED.get(key.referred_table.name)
            assert target is not None, f"{table.name} refers to local {key.referred_table.name}"
            if placement.kind == "reference":
                assert target.kind == "reference", (table.name, key.referred_table.name)
                continue
            if target.kind == "reference":
                continue
            pairs = {(element.parent.name, element.column.name) for element in key.elements}
            assert (placement.column, target.column) in pairs, (table.name, pairs)
