from __future__ import annotations

import pytest

from pikku_celery.errors import ConfigurationError
from pikku_celery.store.engine import make_engine, safe_url


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgres://u@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
        ("sqlite://", "sqlite"),
    ],
)
def test_urls_select_the_shipped_drivers(url: str, driver: str) -> None:
    engine = make_engine(url)
    assert engine.url.drivername == driver
    engine.dispose()


@pytest.mark.parametrize("url", ["not a url", "mysql://u@h/db", "postgresql+asyncpg://u@h/db"])
def test_unusable_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError, match="use postgresql://"):
        make_engine(url)


def test_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIKKU_DATABASE_URL", "sqlite:///from-env.db")
    engine = make_engine()
    assert engine.url.database == "from-env.db"
    engine.dispose()
    monkeypatch.delenv("PIKKU_DATABASE_URL")
    engine = make_engine()
    assert engine.url.database == "pikku.db"
    engine.dispose()


def test_passwords_are_hidden() -> None:
    assert safe_url("postgresql://app:s3cret@db/app") == "postgresql://app:***@db/app"


@pytest.mark.parametrize(
    ("typed", "shown"),
    [
        ("::nonsense::", "::nonsense::"),
        ("postgresql://user:s3cret@host:port/db", "postgresql://user:***@host:port/db"),
        ("postgresql://user:s3cr@t/x@host/db", "postgresql://user:***@host/db"),
        ("user:s3cret@host/db", "user:***@host/db"),
    ],
)
def test_a_url_that_does_not_parse_is_shown_as_typed_with_its_password_masked(
    typed: str, shown: str
) -> None:
    assert safe_url(typed) == shown


def test_a_port_that_is_not_a_number_is_a_configuration_error_naming_the_url() -> None:
    with pytest.raises(ConfigurationError) as raised:
        make_engine("postgresql://user:s3cret@host:port/db")
    assert "'postgresql://user:***@host:port/db' is not a database URL" in str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_psycopg_keeps_the_parse_of_every_batch_statement() -> None:
    # psycopg parses the placeholders of a statement it has not cached at every execute;
    # the set-based batch statements are longer than its default limit (4 KiB).
    from psycopg import _queries
    from sqlalchemy.dialects import postgresql

    from pikku_celery.store.sql.batches import record_attempts_pg, schedule_lone_steps_pg

    make_engine("postgresql://nobody@127.0.0.1:1/none").dispose()  # no connection is made
    dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
    for statement in (record_attempts_pg("succeeded"), schedule_lone_steps_pg):
        text = str(statement.compile(dialect=dialect)).encode()
        assert len(text) <= _queries.MAX_CACHED_STATEMENT_LENGTH
