"""The statements of ``store/versions.py``: workflow versions, first writer wins."""

from __future__ import annotations

from functools import cache
from typing import Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from pikku_celery.schema import workflow_versions as versions

__all__ = ["get_workflow_version", "update_workflow_version_status", "upsert_workflow_version"]

P = sa.bindparam


@cache
def upsert_workflow_version(dialect: str) -> Insert:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        insert(versions)
        .on_conflict_do_nothing(index_elements=["workflow_name", "graph_hash"])
        .returning(versions.c.workflow_name)
    )


get_workflow_version: Final = sa.select(*versions.c).where(
    versions.c.workflow_name == P("workflow_name"), versions.c.graph_hash == P("graph_hash")
)

update_workflow_version_status: Final = (
    sa.update(versions)
    .where(
        versions.c.workflow_name == P("name"),
        versions.c.graph_hash == P("hash"),
    )
    .values(status=P("new_status"))
)
