"""A PostgreSQL server of the bench's own, so every process, commit and WAL byte is the bench's.

The CPU of a server's auxiliary processes (WAL writer, checkpointer, background
writer, autovacuum), its transaction ids and its WAL position are the whole
server's: on a server that others use they would count their work too. The
bench makes one with the Debian cluster tools (``pg_createcluster``, as root; the
cluster belongs to the ``postgres`` user) with the packaged defaults (``fsync``,
``synchronous_commit`` and full page writes on, as a user's server has them),
and drops it at the end however the bench ends.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Final

import sqlalchemy as sa

from bench.harness.pg_tools import PgToolError, newest_postgres, run_tool

__all__ = ["OwnCluster"]

HOST: Final = "127.0.0.1"
_NAME: Final = "pikku_ceiling"
_TIMEOUT: Final = 180.0


def _run(*command: str) -> str:
    try:
        return run_tool(*command)
    except PgToolError as exc:
        raise SystemExit(str(exc)) from None


def _version() -> str:
    try:
        return newest_postgres()
    except PgToolError as exc:
        raise SystemExit(f"{exc}: the bench makes a PostgreSQL server of its own") from None


@dataclass
class OwnCluster:
    """A fresh PostgreSQL cluster on ``port`` for a ``with``: made, started, dropped.

    ``name``: the cluster's own (each bench that makes one names its own, so two
    benches running at once never drop each other's)."""

    port: int
    name: str = _NAME
    version: str = ""

    @property
    def url(self) -> str:
        """The URL of its ``postgres`` database (the bench's databases are made beside it)."""
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    def __enter__(self) -> OwnCluster:
        self.version = _version()
        # Left over by a bench that was killed: dropped, so the cluster starts empty.
        self._drop()
        _run(
            "pg_createcluster", self.version, self.name, "-p", str(self.port),
            "--", "--auth-local=trust", "--auth-host=trust",
        )  # fmt: skip
        _run("pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, "start")
        self._wait_ready()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._drop()

    def _drop(self) -> None:
        subprocess.run(
            ["pg_dropcluster", "--stop", self.version, self.name],
            capture_output=True,
            timeout=_TIMEOUT,
            check=False,
        )

    def _wait_ready(self) -> None:
        engine = sa.create_engine(
            self.url.replace("postgresql://", "postgresql+psycopg://"), poolclass=sa.NullPool
        )
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    with engine.connect() as conn:
                        conn.exec_driver_sql("SELECT 1")
                    return
                except sa.exc.OperationalError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            engine.dispose()
