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
    assert "s3cret" not in safe_url("postgresql://app:s3cret@db/app")
    assert safe_url("::nonsense::") == "<unparseable URL>"
