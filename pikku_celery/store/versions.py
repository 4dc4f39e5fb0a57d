"""Workflow versions: the definition each run was started with, first writer wins."""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy as sa

from pikku_celery.errors import InvalidStatus, VersionNotFound
from pikku_celery.store import sql
from pikku_celery.store.common import now
from pikku_celery.store.connector import Connector
from pikku_celery.store.models import WorkflowVersion

__all__ = ["Versions"]

_VERSION_STATUSES: Final = frozenset({"draft", "active", "declined"})


class Versions:
    """Rows of ``workflow_versions``, keyed by (workflow name, graph hash)."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def upsert_workflow_version(
        self,
        workflow_name: str,
        graph_hash: str,
        graph: Any,
        source: str,
        status: str = "active",
        *,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Record a workflow version; the first writer wins. True when this call wrote it."""
        if status not in _VERSION_STATUSES:
            raise InvalidStatus("workflow version", status, _VERSION_STATUSES)
        row = {
            "workflow_name": workflow_name,
            "graph_hash": graph_hash,
            "graph": self._db.json(graph, "workflow graph"),
            "source": source,
            "status": status,
            "created_at": now(),
        }
        with self._db.single(conn) as c:
            return c.execute(self._db.sql.upsert_workflow_version, row).first() is not None

    def get_workflow_version(
        self, workflow_name: str, graph_hash: str, *, conn: sa.Connection | None = None
    ) -> WorkflowVersion | None:
        with self._db.read(conn) as c:
            row = (
                c.execute(
                    sql.versions.get_workflow_version,
                    {"workflow_name": workflow_name, "graph_hash": graph_hash},
                )
                .mappings()
                .first()
            )
        return None if row is None else WorkflowVersion.from_row(row)

    def update_workflow_version_status(
        self,
        workflow_name: str,
        graph_hash: str,
        status: str,
        *,
        conn: sa.Connection | None = None,
    ) -> None:
        if status not in _VERSION_STATUSES:
            raise InvalidStatus("workflow version", status, _VERSION_STATUSES)
        params = {"name": workflow_name, "hash": graph_hash, "new_status": status}
        with self._db.single(conn) as c:
            if c.execute(sql.versions.update_workflow_version_status, params).rowcount == 0:
                raise VersionNotFound(workflow_name, graph_hash)
