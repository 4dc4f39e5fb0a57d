"""Which database a command acts on: none where there is none, the one it was given, and
what a wrong SQLite path says. In process, on SQLite files of the test's own."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from pikku_celery import WorkflowStore
from pikku_celery.cli import commands as cli
from pikku_celery.cli import common as codes

READ_ONLY_COMMANDS = [
    ["runs", "show", "r1"],
    ["runs", "list"],
    ["runs", "delete", "r1"],
    ["healthcheck"],
    ["db", "current"],
    ["db", "check"],
    ["prune", "--older-than", "1d"],
    ["journal", "--replay"],
    ["dashboard"],
]


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current folder, journals elsewhere, no database URL in the environment."""
    folder = tmp_path / "here"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("PIKKU_DATABASE_URL", raising=False)
    monkeypatch.delenv("PIKKU_CELERY_APP", raising=False)
    monkeypatch.setenv("PIKKU_JOURNAL_DIR", str(tmp_path / "journal"))
    monkeypatch.setattr(uvicorn.Server, "run", lambda *args, **kwargs: None)
    return folder


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=" ".join)
def test_a_command_that_needs_a_database_creates_none_and_says_how_to_make_one(
    cwd: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(command) == codes.EXIT_ERROR
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: There is no pikku-celery database")
    assert f"at {cwd / 'pikku.db'} " in error
    assert f"`pikku-celery db upgrade --database-url sqlite:///{cwd / 'pikku.db'}`" in error
    assert list(cwd.iterdir()) == []


def test_a_relative_path_with_a_folder_hints_at_four_slashes(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--database-url", "sqlite:///tmp/x.db", "runs", "list"]) == codes.EXIT_ERROR
    error = capsys.readouterr().err
    assert f"no pikku-celery database at {cwd / 'tmp' / 'x.db'} " in error
    assert "an absolute path needs four slashes, like sqlite:////tmp/x.db" in error
    assert list(cwd.iterdir()) == []


def test_the_journal_without_replay_only_reads_the_journals(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["journal"]) == codes.EXIT_OK
    assert "0 mirror events wait" in capsys.readouterr().out
    assert list(cwd.iterdir()) == []


def test_db_upgrade_creates_the_database(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["db", "upgrade"]) == codes.EXIT_OK
    assert (cwd / "pikku.db").is_file()
    assert cli.main(["runs", "list"]) == codes.EXIT_OK
    assert "No runs yet." in capsys.readouterr().out


def test_a_missing_sqlite_folder_is_named_with_its_absolute_path(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--database-url", "sqlite:///tmp/x.db", "db", "upgrade"]) == codes.EXIT_ERROR
    error = capsys.readouterr().err
    assert f"The SQLite database {cwd / 'tmp' / 'x.db'} " in error
    assert f"its folder {cwd / 'tmp'} does not exist" in error
    assert "sqlite:////tmp/x.db" in error
    assert "check that it is running" not in error
    assert list(cwd.iterdir()) == []


# --- --app and --database-url -----------------------------------------------------------

APP_SOURCE = """
from celery import Celery
from pikku_celery import PikkuCelery

app = Celery("cli_database_app", broker="memory://", set_as_current=False)
pikku = PikkuCelery(app{pinned})
"""


@pytest.fixture
def make_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Writes an app module in the current folder, importable by ``--app``; forgets it after."""
    names: list[str] = []

    def make(pinned: str | None = None) -> str:
        name = f"cli_database_app_{uuid.uuid4().hex[:8]}"
        extra = "" if pinned is None else f", database_url={pinned!r}"
        (Path.cwd() / f"{name}.py").write_text(APP_SOURCE.format(pinned=extra))
        names.append(name)
        return f"{name}:pikku"

    monkeypatch.syspath_prepend(str(Path.cwd()))
    yield make
    for name in names:
        module = sys.modules.pop(name, None)
        if module is not None:
            module.pikku.uninstall()
            module.app.close()


@pytest.fixture
def given(tmp_path: Path) -> Iterator[WorkflowStore]:
    """The database named on the command line, with one running run."""
    store = WorkflowStore(f"sqlite:///{tmp_path / 'given.db'}")
    store.init()
    yield store
    store.close()


def url_of(store: WorkflowStore) -> str:
    return store.engine.url.render_as_string(hide_password=False)


def test_the_given_url_is_the_apps_database_when_the_app_takes_it_from_the_environment(
    cwd: Path, make_app: object, given: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = given.create_run("checkout", {})
    spec = make_app()  # type: ignore[operator]
    command = ["--database-url", url_of(given), "--app", spec, "runs", "cancel", run_id]
    assert cli.main(command) == codes.EXIT_OK, capsys.readouterr().err
    assert capsys.readouterr().out.strip() == f"Cancelled run {run_id}."
    assert given.get_run(run_id).status == "cancelled"
    assert "PIKKU_DATABASE_URL" not in os.environ  # only while the app was imported
    assert not (cwd / "pikku.db").exists()  # the app's default was never touched


def test_an_app_that_names_another_database_is_a_clear_error(
    cwd: Path,
    tmp_path: Path,
    make_app: object,
    given: WorkflowStore,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = given.create_run("checkout", {})
    own = f"sqlite:///{tmp_path / 'own.db'}"
    spec = make_app(own)  # type: ignore[operator]
    for command in (
        ["runs", "cancel", run_id],
        ["runs", "resume", run_id],
        ["runs", "rerun", run_id, "--from-step", "s"],
        ["runs", "send", run_id, "evt"],
        ["reap"],
        ["dashboard"],
    ):
        assert cli.main(["--database-url", url_of(given), "--app", spec, *command]) == 1
        error = capsys.readouterr().err
        assert error.count("\n") == 1, error
        assert f"--app {spec!r} mirrors into {own}, but --database-url" in error, command
        assert f"names {url_of(given)}" in error and "Leave --database-url out" in error
    assert given.get_run(run_id).status == "running"
    assert not (tmp_path / "own.db").exists()


def test_the_same_database_written_another_way_is_no_conflict(
    cwd: Path, make_app: object, given: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = given.create_run("checkout", {})
    spec = make_app(url_of(given))  # type: ignore[operator]
    relative = f"sqlite:///{os.path.relpath(given.engine.url.database or '', cwd)}"
    assert cli.main(["--database-url", relative, "--app", spec, "runs", "cancel", run_id]) == 0
    assert given.get_run(run_id).status == "cancelled"


def test_an_apps_missing_database_is_not_created(
    cwd: Path, make_app: object, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = make_app()  # type: ignore[operator]
    assert cli.main(["--app", spec, "runs", "cancel", "r1"]) == codes.EXIT_ERROR
    assert f"no pikku-celery database at {cwd / 'pikku.db'} " in capsys.readouterr().err
    assert not (cwd / "pikku.db").exists()
