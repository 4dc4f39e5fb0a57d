"""The benches' own databases on a PostgreSQL server: made fresh, counted, dropped."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import make_url

__all__ = ["DEFAULT_PG_URL", "PG_URL_ENV", "BenchDatabases"]

PG_URL_ENV: Final = "PIKKU_BENCH_PG_URL"
DEFAULT_PG_URL: Final = os.environ.get(PG_URL_ENV) or "postgresql://postgres@127.0.0.1:5432/test"


class BenchDatabases:
    """Databases ``names`` on the server of ``admin_url``, which is only connected to.

    The bench drops and recreates its own databases; it refuses an admin URL
    naming one of them, so it never drops the database it was pointed at.
    """

    def __init__(self, admin_url: str, names: Sequence[str]) -> None:
        parsed = make_url(admin_url)
        if parsed.get_backend_name() not in ("postgresql", "postgres"):
            raise SystemExit(f"--pg-url must be a postgresql:// URL, not {parsed.drivername}://")
        if parsed.database in names:
            raise SystemExit(
                f"--pg-url names {parsed.database!r}, a database the bench drops and "
                "recreates; point it at another database on the same server."
            )
        self.names = tuple(names)
        self._url = parsed.set(drivername="postgresql+psycopg")
        self._admin = sa.create_engine(self._url, isolation_level="AUTOCOMMIT")
        self._created: set[str] = set()

    def url(self, name: str) -> str:
        return self._url.set(database=name).render_as_string(hide_password=False)

    def fresh(self, name: str) -> str:
        """Database ``name`` made empty; its URL."""
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        self._created.add(name)
        return self.url(name)

    def create(self) -> None:
        for name in self.names:
            self.fresh(name)

    def drop(self) -> None:
        with self._admin.connect() as conn:
            for name in sorted(self._created):
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._created.clear()
        self._admin.dispose()

    def _stat(self, column: str, name: str) -> int:
        with self._admin.connect() as conn:
            # A new snapshot: within one transaction the statistics views stay frozen.
            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            value = conn.execute(
                sa.text(f"SELECT {column} FROM pg_stat_database WHERE datname = :d"), {"d": name}
            ).scalar_one()
        return int(value)

    def transactions(self, name: str, *, wait: float = 0.0) -> int:
        """Commits and rollbacks the server counted for ``name``, after ``wait`` seconds.

        An idle backend flushes its statistics late (PostgreSQL 15: within
        10 s), so a caller comparing two readings waits for them to settle.
        """
        time.sleep(wait)
        return self._stat("xact_commit + xact_rollback", name)

    def commits(self, name: str, timeout: float = 20.0) -> int:
        """``xact_commit`` of ``name`` once every backend on it is gone and flushed.

        Backends report their statistics lazily but always as they exit, after
        they leave ``pg_stat_activity``: wait for none to be left, then for two
        equal readings in a row. Read from the admin database, so the reading
        commits nothing in ``name``.
        """
        deadline = time.monotonic() + timeout
        last: int | None = None
        while time.monotonic() < deadline:
            with self._admin.connect() as conn:
                left = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = :d AND backend_type = 'client backend'"
                    ),
                    {"d": name},
                ).scalar_one()
            if left:
                time.sleep(0.05)
                continue
            value = self._stat("xact_commit", name)
            if value == last:
                return value
            last = value
            time.sleep(0.3)
        raise SystemExit(f"{name}: its backends did not go away within {timeout:.0f} s")
