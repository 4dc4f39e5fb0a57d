"""``pikku-celery dashboard``: options from the environment, and a clear word without the extra."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from pikku_celery.cli import commands as cli
from pikku_celery.cli import common as codes


def test_help_names_every_environment_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["dashboard", "--help"])
    out = capsys.readouterr().out
    for name in (
        "PIKKU_DASHBOARD_HOST",
        "PIKKU_DASHBOARD_PORT",
        "PIKKU_FLOWER_URL",
        "PIKKU_DASHBOARD_PASSWORD",
    ):
        assert f"[env: {name}]" in " ".join(out.split()), name


def test_serves_with_settings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    served: dict[str, Any] = {}

    def fake_run(app: Any, **options: Any) -> None:
        served.update(app=app, **options)

    monkeypatch.setattr(uvicorn, "run", fake_run)
    monkeypatch.setenv("PIKKU_DASHBOARD_PORT", "9123")
    monkeypatch.setenv("PIKKU_FLOWER_URL", "http://flower.example:5555")
    monkeypatch.setenv("PIKKU_DASHBOARD_PASSWORD", "pw")
    (tmp_path / "cli.db").touch()  # the dashboard reads a database, it never creates one
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert cli.main(["--database-url", url, "dashboard", "--host", "0.0.0.0"]) == codes.EXIT_OK
    assert (served["host"], served["port"]) == ("0.0.0.0", 9123)
    assert "sign in" in capsys.readouterr().out


def test_a_bad_flower_url_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    (tmp_path / "cli.db").touch()  # the dashboard reads a database, it never creates one
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    code = cli.main(["--database-url", url, "dashboard", "--flower-url", "javascript:alert(1)"])
    assert code == codes.EXIT_ERROR
    assert "http(s) address" in capsys.readouterr().err


def test_without_the_extra_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if it were not installed
    assert cli.main(["dashboard"]) == codes.EXIT_ERROR
    assert "Run `pip install pikku-celery[dashboard]`." in capsys.readouterr().err
