"""The statements of ``store/versions.py``: workflow versions, first writer wins."""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from sqlalchemy.sql.dml import Insert

from pikku_celery.schema import workflow_versions as versions
from pikku_celery.store.sql.spelling import Upsert

__all__ = ["get_workflow_version", "update_workflow_version_status", "upsert_workflow_version"]

P = sa.bindparam


def upsert_workflow_version(insert: Upsert) -> Insert:
    statement: Insert = (
        insert(versions)
        .on_conflict_do_nothing(index_elements=["workflow_name", "graph_hash"])
        .returning(versions.c.workflow_name)
    )
    return statement


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
