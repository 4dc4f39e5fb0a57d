"""Reading which indexes a query plan uses, on either layout of the tables.

On the partitioned layout each day's partition has its own copy of an index, named by
PostgreSQL from the partition: a plan names those, not the index of the parent table.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["index_and_partitions"]


def index_and_partitions(conn: sa.Connection, index: str) -> set[str]:
    """``index`` and, on PostgreSQL, every partition's index made from it."""
    if conn.dialect.name != "postgresql":
        return {index}
    parts = conn.execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:index)"
        ),
        {"index": index},
    ).scalars()
    return {index, *parts}
