"""``--database-url``, ``-v`` and ``--app`` before the command or after it, on every command.

In process, on SQLite files of the test's own: the same command with the option on either
side reads the same database, and one given before the command is not undone by the
command's own defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.cli import commands as cli
from pikku_celery.cli import common as codes
from pikku_celery.errors import RunNotFound

GLOBAL_OPTIONS = ("--database-url", "-v", "--verbose", "--app")


def every_command(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield (*path, name), command
                yield from every_command(command, (*path, name))


def test_every_command_takes_the_global_options() -> None:
    commands = list(every_command(cli.build_parser()))
    assert len(commands) > 15  # db upgrade ... journal, spool
    for path, command in commands:
        options = {s for action in command._actions for s in action.option_strings}
        assert set(GLOBAL_OPTIONS) <= options, path
        assert "[env: PIKKU_DATABASE_URL]" in " ".join(command.format_help().split()), path


@pytest.fixture
def databases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """Two databases: one with a run, the other empty; the current folder has neither."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIKKU_DATABASE_URL", raising=False)
    urls = []
    for name in ("with-a-run", "empty"):
        store = WorkflowStore(f"sqlite:///{tmp_path / name}.db")
        store.init()
        if name == "with-a-run":
            store.create_run("checkout", {"order": 1})
        store.close()
        urls.append(f"sqlite:///{tmp_path / name}.db")
    yield urls[0], urls[1]


@pytest.mark.parametrize(
    "placed",
    [
        lambda url: ["--database-url", url, "runs", "list", "--json"],
        lambda url: ["runs", "--database-url", url, "list", "--json"],
        lambda url: ["runs", "list", "--json", "--database-url", url],
        lambda url: [f"--database-url={url}", "runs", "list", "--json"],
        lambda url: ["runs", "list", f"--database-url={url}", "--json"],
    ],
    ids=["before", "between", "after", "before=", "after="],
)
def test_the_database_url_on_either_side_is_the_same_database(
    databases: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
    placed: Callable[[str], list[str]],
) -> None:
    with_a_run, _ = databases
    assert cli.main(placed(with_a_run)) == codes.EXIT_OK
    assert '"workflow": "checkout"' in capsys.readouterr().out


def test_a_database_url_before_the_command_stays_when_none_comes_after(
    databases: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with_a_run, _ = databases
    assert cli.main(["--database-url", with_a_run, "db", "check"]) == codes.EXIT_OK
    assert cli.main(["--database-url", with_a_run, "-v", "runs", "list"]) == codes.EXIT_OK
    assert "checkout" in capsys.readouterr().out


def test_the_one_after_the_command_is_the_one_used(
    databases: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with_a_run, empty = databases
    assert cli.main(["--database-url", with_a_run, "runs", "list", "--database-url", empty]) == 0
    assert capsys.readouterr().out.strip() == "No runs yet."


def test_verbose_after_the_command_logs_the_traceback(
    databases: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, empty = databases
    assert cli.main(["runs", "show", "no-such-run", "--database-url", empty]) == 1
    assert not [r for r in caplog.records if r.exc_info]
    assert cli.main(["runs", "show", "no-such-run", "--database-url", empty, "-v"]) == 1
    [failed] = [r for r in caplog.records if r.exc_info]
    assert failed.getMessage() == "pikku-celery failed"
    assert failed.exc_info is not None and failed.exc_info[0] is RunNotFound


def test_the_app_after_a_command_that_needs_it(
    databases: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, empty = databases
    assert cli.main(["reap", "--database-url", empty, "--app", "no_such_module_here"]) == 1
    assert "cannot import 'no_such_module_here'" in capsys.readouterr().err


def test_the_demo_takes_the_database_url_on_either_side(monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[str] = []

    def run_demo(database_url: str, broker_url: str | None = None) -> int:
        given.append(database_url)
        return 0

    monkeypatch.setattr("pikku_celery.demo.command.run_demo", run_demo)
    assert cli.main(["--database-url", "sqlite:///a.db", "demo"]) == 0
    assert cli.main(["demo", "--database-url", "sqlite:///b.db"]) == 0
    assert given == ["sqlite:///a.db", "sqlite:///b.db"]
