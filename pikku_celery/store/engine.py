"""Making a SQLAlchemy engine from a pikku-celery database URL."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from pikku_celery.errors import ConfigurationError
from pikku_celery.store.sqlite_forks import gate_forks

__all__ = [
    "DEFAULT_DATABASE_URL",
    "database_key",
    "database_url_from_env",
    "make_engine",
    "require_existing_database",
    "safe_url",
    "same_database",
    "sqlite_file",
    "sqlite_path_hint",
]

DEFAULT_DATABASE_URL: Final = "sqlite:///pikku.db"
ENV_DATABASE_URL: Final = "PIKKU_DATABASE_URL"
# A streaming replica of that database, for the faces' reads (dashboard, CLI, metrics).
ENV_READ_DATABASE_URL: Final = "PIKKU_READ_DATABASE_URL"

# Drivers people write out of habit, mapped to the one pikku-celery ships with.
_DRIVER_ALIASES: Final = {
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "sqlite": "sqlite",
}
_SUPPORTED: Final = ("postgresql+psycopg", "sqlite")


def database_url_from_env() -> str:
    return os.environ.get(ENV_DATABASE_URL) or DEFAULT_DATABASE_URL


# ``password=...`` in a query string (libpq takes it there too), up to the next ``&``.
_QUERY_PASSWORD: Final = re.compile(r"(?i)([?&]password=)[^&]*")


def _mask_text(text: str) -> str:
    """A URL that does not parse, its password masked by hand: the user still sees what
    they typed, so they can spot the typo, but never the secret."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    # The last ``@`` ends the user info: a password may hold ``@`` or ``/`` unescaped, and
    # masking too much is better than showing part of the secret.
    user_info, at, host = rest.rpartition("@")
    if at and ":" in user_info:
        rest = f"{user_info.partition(':')[0]}:***@{host}"
    return _QUERY_PASSWORD.sub(r"\1***", f"{scheme}{sep}{rest}")


def safe_url(url: str | sa.URL) -> str:
    """The URL with its password hidden, fit for logs and error messages; a URL that does
    not parse is shown as it was typed, its password masked all the same."""
    if isinstance(url, str) and url.partition("://")[2].count("@") > 1:
        # An unescaped ``@`` in the password: parsed, the rest of the password would be
        # shown as the host.
        return _mask_text(url)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        return _mask_text(str(url))


def _normalise(url: str | sa.URL) -> sa.URL:
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018  (parsed lazily: a port that is not a number fails here)
    except (ArgumentError, ValueError) as exc:
        raise ConfigurationError(
            f"{safe_url(url)!r} is not a database URL; use postgresql://user@host/db "
            "or sqlite:///path/to/file.db."
        ) from exc
    driver = _DRIVER_ALIASES.get(parsed.drivername, parsed.drivername)
    if driver not in _SUPPORTED:
        raise ConfigurationError(
            f"pikku-celery does not support {parsed.drivername!r} databases; "
            "use postgresql:// (psycopg 3) or sqlite://."
        )
    return parsed.set(drivername=driver)


def sqlite_file(url: str | sa.URL) -> Path | None:
    """The absolute path a SQLite URL's file resolves to from the current folder (None: not
    SQLite, in memory, or an SQLite ``file:`` URI, whose path SQLite itself reads)."""
    parsed = _normalise(url)
    database = parsed.database
    if (
        parsed.get_backend_name() != "sqlite"
        or not database
        or database == ":memory:"
        or database.startswith("file:")
        or parsed.query.get("uri") in ("true", "1")
    ):
        return None
    return Path(os.path.abspath(database))


def sqlite_path_hint(url: str | sa.URL) -> str:
    """Where a SQLite URL points, and for a relative one how to write the absolute path: the
    three slashes of ``sqlite:///tmp/x.db`` make ``tmp/x.db`` relative to the current folder."""
    path = sqlite_file(url)
    database = _normalise(url).database
    if path is None or database is None:
        return ""
    if Path(database).is_absolute():
        return str(path)
    if database.startswith(".") or "/" not in database:
        return f"{path} ({safe_url(url)} is relative to the current folder)"
    return (
        f"{path} ({safe_url(url)} is relative to the current folder; an absolute path needs "
        f"four slashes, like sqlite:////{database})"
    )


def require_existing_database(url: str | sa.URL) -> None:
    """For commands that only read or change what is there: SQLite would create an empty
    file on connecting, so a mistyped path would look like a database without runs."""
    path = sqlite_file(url)
    if path is None or path.is_file():
        return
    absolute = f"sqlite:///{path}"
    raise ConfigurationError(
        f"There is no pikku-celery database at {sqlite_path_hint(url)}. Create one with "
        f"`pikku-celery db upgrade --database-url {absolute}` (or WorkflowStore.init()), or "
        "point at the database your workers write to (--database-url or PIKKU_DATABASE_URL)."
    )


def database_key(url: str | sa.URL) -> str:
    """The database a URL names, as text: one per database however the URL is spelled.

    SQLite: the file's absolute path (two projects' ``sqlite:///pikku.db`` are two
    databases); a server: its host, port, database and user, whatever the driver
    alias, password or connection options.
    """
    parsed = _normalise(url)
    if parsed.get_backend_name() == "sqlite":
        return f"sqlite:{sqlite_file(parsed) or parsed.database or ''}"
    return (
        f"{parsed.get_backend_name()}://{parsed.username or ''}@{parsed.host or ''}"
        f":{parsed.port or 5432}/{parsed.database or ''}"
    )


def same_database(first: str | sa.URL, second: str | sa.URL) -> bool:
    """Whether two URLs name one database: same server, user and database (SQLite: the same
    file), whatever the driver alias, password or connection options."""
    return database_key(first) == database_key(second)


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # Off by default in SQLite; cascades from runs to steps need it.
        cursor.execute("PRAGMA foreign_keys=ON")
        # Worker processes write concurrently: let readers and one writer overlap,
        # and wait for the lock instead of failing at once.
        cursor.execute("PRAGMA busy_timeout=30000")
        mode = cursor.execute("PRAGMA journal_mode").fetchone()
        if mode and mode[0] != "memory":
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def configure_engine(engine: sa.Engine) -> sa.Engine:
    """Attach pikku-celery's per-connection settings to an engine (idempotent)."""
    if engine.dialect.name == "postgresql":
        _cache_long_statements()
    if engine.dialect.name == "sqlite":
        if not sa.event.contains(engine, "connect", _on_sqlite_connect):
            sa.event.listen(engine, "connect", _on_sqlite_connect)
        gate_forks(engine)
    return engine


# psycopg parses a statement's placeholders once per text and keeps the result, but only
# for texts up to 4 KiB: the batch's set-based statements are longer (7 KiB), and parsing
# one again costs about 0.2 ms, at every batch, for each of them. Its cache is bounded
# (128 texts), so a longer limit costs little memory. The limit is not public API: an
# older or newer psycopg without it is left as it is.
_STATEMENT_CACHE_LIMIT: Final = 32 * 1024


def _cache_long_statements() -> None:
    try:
        from psycopg import _queries
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return
    limit = getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", None)
    if isinstance(limit, int) and limit < _STATEMENT_CACHE_LIMIT:
        _queries.MAX_CACHED_STATEMENT_LENGTH = _STATEMENT_CACHE_LIMIT


def make_engine(url: str | sa.URL | None = None, **engine_options: Any) -> sa.Engine:
    """An engine for ``url`` (default: ``PIKKU_DATABASE_URL``, else ``sqlite:///pikku.db``)."""
    parsed = _normalise(url if url is not None else database_url_from_env())
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        # A database cut off by the network must fail fast (the journal keeps the events
        # meanwhile), not hold a flush or a command for the system's TCP timeout.
        connect_args = dict(engine_options.pop("connect_args", {}))
        connect_args.setdefault("connect_timeout", 5)
        engine_options["connect_args"] = connect_args
    # No pool_pre_ping: it would cost a round trip on every transition; a
    # dropped connection surfaces as StoreUnavailable and the caller retries.
    return configure_engine(sa.create_engine(parsed, **engine_options))
