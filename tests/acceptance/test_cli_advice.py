"""Every ``pikku-celery ...`` command a message suggests runs as written, and works.

A message that says what to do is only good if doing it works: ``pikku-celery db upgrade
--database-url sqlite:////...`` once failed with "unrecognized arguments". Each test here
makes the message appear for real (a command's error, a dashboard page, a log or error
text), takes the command out of it, and runs it in a subprocess through the installed
``pikku-celery`` script, as a user would paste it. The environment stands for what a user
has set already (``PIKKU_DATABASE_URL``), and ``proj:pikku`` and ``module:pikku`` in a
message are modules of that name in the current folder, since a user puts their own
there.

``test_every_suggested_command_is_run_here`` reads the package's messages (string
literals and templates) for suggested commands, so a message added later without a test
here fails it.
"""

from __future__ import annotations

import ast
import html
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import pikku_celery
from pikku_celery import WorkflowStore
from pikku_celery.cli import common as codes
from pikku_celery.dashboard import create_app
from pikku_celery.dashboard.metrics import collect_metrics
from pikku_celery.errors import RunFailed
from tests.acceptance.conftest import redis_db
from tests.conftest import PgServer
from tests.dashboard.conftest import PASSWORD, csrf_token, lost_run

PIKKU_CELERY = Path(sys.executable).with_name("pikku-celery")
PACKAGE = Path(pikku_celery.__file__).parent
COMMANDS = "db|demo|dashboard|healthcheck|runs|prune|reap|journal|spool"
# A command is suggested in backticks, in <code>, or in parentheses.
SUGGESTED = re.compile(r"(?:`|<code>|\()(pikku-celery (?:" + COMMANDS + r")\b[^`<>(),;\"]*)")

APP_SOURCE = """
import os

from celery import Celery

from pikku_celery import PikkuCelery

app = Celery("advice", broker=os.environ["ADVICE_BROKER_URL"], set_as_current=False)
pikku = PikkuCelery(app)
"""

# Each command the package's messages suggest (a placeholder as {}), and the test that runs it.
RUN_HERE = {
    "pikku-celery db upgrade --database-url {}": "test_db_upgrade_for_a_missing_sqlite_file",
    "pikku-celery db upgrade": "test_db_upgrade_for_a_schema_that_is_behind",
    "pikku-celery db distribute": "test_db_distribute_for_a_database_not_ready_for_it",
    "pikku-celery prune --older-than 30d": "test_db_upgrade_to_the_partitioned_layout_on_sqlite",
    "pikku-celery db upgrade --layout partitioned": (
        "test_db_upgrade_to_the_partitioned_layout_on_postgresql"
    ),
    "pikku-celery runs list": "test_runs_list_for_a_run_that_takes_no_events",
    "pikku-celery reap --app proj:pikku": "test_reap_for_lost_steps",
    "pikku-celery dashboard --app module:pikku": "test_dashboard_with_the_app_for_run_actions",
    "pikku-celery journal --replay": "test_journal_replay_for_set_aside_events",
    "pikku-celery runs show {}": "test_runs_show_for_a_failed_run",
    "pikku-celery runs resume {} --app module:pikku": (
        "test_runs_resume_for_a_step_the_reaper_gave_up"
    ),
}


def suggested(text: str) -> list[str]:
    return [match.group(1).strip() for match in SUGGESTED.finditer(html.unescape(text))]


def _texts(path: Path) -> Iterator[str]:
    """The messages of a module (its string literals but docstrings) or a template."""
    if path.suffix == ".html":
        yield path.read_text(encoding="utf-8")
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        elif isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            yield "".join(
                part.value
                if isinstance(part, ast.Constant) and isinstance(part.value, str)
                else "{}"
                for part in node.values
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.value


def test_every_suggested_command_is_run_here() -> None:
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".py", ".html"):
            for text in _texts(path):
                for command in suggested(text):
                    found.setdefault(command, set()).add(str(path.relative_to(PACKAGE)))
    assert "pikku-celery db upgrade --database-url {}" in found  # the scan sees f-strings
    not_run = {command: where for command, where in found.items() if command not in RUN_HERE}
    assert not not_run, f"suggested but not run by a test here: {not_run}"
    assert set(RUN_HERE) <= set(found), "a test here runs a command no message suggests"
    for name in RUN_HERE.values():
        assert callable(globals().get(name)), name


# --- running a command as written ---------------------------------------------------------


@dataclass
class Shell:
    """A user's terminal: a current folder and what is set in the environment."""

    cwd: Path
    env: dict[str, str]

    def run(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = shlex.split(command)
        assert argv[0] == "pikku-celery", command
        return subprocess.run(
            [str(PIKKU_CELERY), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.cwd,
            env={**os.environ, **self.env},
            check=False,
        )

    def app_module(self, name: str) -> None:
        (self.cwd / f"{name}.py").write_text(APP_SOURCE)


@pytest.fixture
def shell(tmp_path: Path) -> Shell:
    assert PIKKU_CELERY.is_file(), f"the installed script is missing: {PIKKU_CELERY}"
    here = tmp_path / "here"
    here.mkdir()
    return Shell(
        here,
        {
            "PIKKU_JOURNAL_DIR": str(tmp_path / "journal"),
            "ADVICE_BROKER_URL": redis_db(9),
            "PIKKU_DASHBOARD_PORT": "0",
        },
    )


@pytest.fixture
def database(tmp_path: Path, shell: Shell) -> Iterator[WorkflowStore]:
    """A migrated SQLite database, the one PIKKU_DATABASE_URL names."""
    url = f"sqlite:///{tmp_path / 'work.db'}"
    store = WorkflowStore(url)
    store.init()
    shell.env["PIKKU_DATABASE_URL"] = url
    yield store
    store.close()


def one(commands: list[str]) -> str:
    assert len(set(commands)) == 1, commands
    return commands[0]


def test_db_upgrade_for_a_missing_sqlite_file(shell: Shell, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    for given in (f"sqlite:///{tmp_path / 'data' / 'pikku.db'}", "sqlite:///../data/other.db"):
        missing = shell.run(f"pikku-celery runs list --database-url {given}")
        assert missing.returncode == codes.EXIT_ERROR, missing.stderr
        advice = one(suggested(missing.stderr))
        assert advice.startswith("pikku-celery db upgrade --database-url sqlite:////"), advice
        # As pasted anywhere: the path in it is absolute.
        elsewhere = Shell(tmp_path, shell.env)
        done = elsewhere.run(advice)
        assert done.returncode == codes.EXIT_OK, done.stderr
        assert "from empty to" in done.stdout or "already at revision" in done.stdout
        assert shell.run(f"pikku-celery runs list --database-url {given}").returncode == 0
    assert sorted(p.name for p in (tmp_path / "data").glob("*.db")) == ["other.db", "pikku.db"]


def test_db_upgrade_for_a_schema_that_is_behind(shell: Shell, tmp_path: Path) -> None:
    (tmp_path / "empty.db").touch()  # an SQLite database where pikku-celery never ran
    shell.env["PIKKU_DATABASE_URL"] = f"sqlite:///{tmp_path / 'empty.db'}"
    advice = []
    for command in ("db check", "healthcheck", "db current", "runs list"):
        result = shell.run(f"pikku-celery {command}")
        advice += suggested(result.stdout + result.stderr)
    assert advice == ["pikku-celery db upgrade"] * 4
    done = shell.run(advice[0])
    assert done.returncode == codes.EXIT_OK, done.stderr
    assert shell.run("pikku-celery db check").returncode == codes.EXIT_OK


def test_db_distribute_for_a_database_not_ready_for_it(shell: Shell, pg_server: PgServer) -> None:
    shell.env["PIKKU_DATABASE_URL"] = pg_server.create_database("pikku_advice")
    refused = shell.run("pikku-celery db distribute")
    assert refused.returncode == codes.EXIT_ERROR
    advice = suggested(refused.stderr)
    if not pg_server.citus:
        # No Citus here: the advice is SQL to run on the cluster, then the command again,
        # which runs as written and says the same.
        assert "CREATE EXTENSION citus" in refused.stderr
        assert advice == ["pikku-celery db distribute"]
        again = shell.run(advice[0])
        assert again.returncode == codes.EXIT_ERROR
        assert again.stderr == refused.stderr
        return
    assert advice == ["pikku-celery db upgrade", "pikku-celery db distribute"]
    for command in advice:
        done = shell.run(command)
        assert done.returncode == codes.EXIT_OK, done.stderr
    assert "Distributed on" in done.stdout


def test_db_upgrade_to_the_partitioned_layout_on_sqlite(shell: Shell, tmp_path: Path) -> None:
    shell.env["PIKKU_DATABASE_URL"] = f"sqlite:///{tmp_path / 'work.db'}"
    refused = shell.run("pikku-celery db upgrade --layout partitioned")
    assert refused.returncode == codes.EXIT_ERROR, refused.stderr
    advice = suggested(refused.stderr)
    assert advice == ["pikku-celery db upgrade", "pikku-celery prune --older-than 30d"]
    for command in advice:
        done = shell.run(command)
        assert done.returncode == codes.EXIT_OK, done.stderr
    assert done.stdout.startswith("Pruned 0 runs (0 steps, 0 attempts)"), done.stdout


def test_db_upgrade_to_the_partitioned_layout_on_postgresql(
    shell: Shell, pg_server: PgServer
) -> None:
    # What a refusal of the layout's upkeep or conversion on a database behind suggests.
    shell.env["PIKKU_DATABASE_URL"] = pg_server.create_database("pikku_advice_layout")
    done = shell.run("pikku-celery db upgrade --layout partitioned")
    assert done.returncode == codes.EXIT_OK, done.stderr
    assert "partitioned 6 tables by run_day" in done.stdout, done.stdout
    current = shell.run("pikku-celery db current")
    assert "partitioned" in current.stdout, current.stdout


def test_runs_list_for_a_run_that_takes_no_events(shell: Shell, database: WorkflowStore) -> None:
    run_id = database.create_run("shop.charge", {}, wire={"type": "task"})
    shell.app_module("proj")
    refused = shell.run(f"pikku-celery runs send {run_id} approval --app proj:pikku")
    assert refused.returncode == codes.EXIT_ERROR, refused.stderr
    listing = shell.run(one(suggested(refused.stderr)))
    assert listing.returncode == codes.EXIT_OK, listing.stderr
    assert run_id in listing.stdout


def test_reap_for_lost_steps(shell: Shell, database: WorkflowStore) -> None:
    lost_run(database)
    with TestClient(create_app(database)) as client:
        page = client.get("/").text
    metrics = collect_metrics(database, stale_after=600)
    advice = one(suggested(page) + suggested(metrics))
    assert advice == "pikku-celery reap --app proj:pikku"
    shell.app_module("proj")
    reaped = shell.run(advice)
    assert reaped.returncode == codes.EXIT_OK, reaped.stderr
    assert reaped.stdout.startswith("Checked ") and "workers answering: none." in reaped.stdout


def test_dashboard_with_the_app_for_run_actions(shell: Shell, database: WorkflowStore) -> None:
    run_id = database.create_run("checkout", {}, status="failed")
    signed_in = ("anyone", PASSWORD)
    with TestClient(create_app(database, auth_token=PASSWORD)) as client:
        token = csrf_token(client.get(f"/runs/{run_id}", auth=signed_in).text)
        refused = client.post(f"/runs/{run_id}/resume", data={"csrf_token": token}, auth=signed_in)
    assert refused.status_code == 404
    advice = one(suggested(refused.text))
    shell.app_module(advice.split("--app ")[1].split(":")[0])
    shell.env["PIKKU_DASHBOARD_PASSWORD"] = PASSWORD
    argv = shlex.split(advice)
    server = subprocess.Popen(
        [str(PIKKU_CELERY), *argv[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=shell.cwd,
        env={**os.environ, **shell.env},
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert "sign in to resume, rerun, cancel and delete runs" in line, line
        url = re.search(r"http://\S+/", line)
        assert url is not None, line
        with urllib.request.urlopen(url.group(0) + "healthz", timeout=10) as answer:
            assert answer.status == 200
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert "Traceback" not in stderr


def test_journal_replay_for_set_aside_events(shell: Shell, database: WorkflowStore) -> None:
    # Logged when an event is set aside; the source is where the message can be read.
    logged = (PACKAGE / "mirror" / "deferral.py").read_text(encoding="utf-8")
    advice = one([c for c in suggested(logged) if c.startswith("pikku-celery journal")])
    replayed = shell.run(advice)
    assert replayed.returncode == codes.EXIT_OK, replayed.stderr
    assert "Wrote 0 events from journals of processes that ended" in replayed.stdout


def test_the_help_a_usage_error_suggests(shell: Shell) -> None:
    wrong = shell.run("pikku-celery runs list --limit 0")
    assert wrong.returncode == codes.EXIT_USAGE
    helped = shell.run(one(suggested(wrong.stderr)))
    assert helped.returncode == codes.EXIT_OK
    assert helped.stdout.startswith("usage: pikku-celery runs list")


def test_runs_show_for_a_failed_run(shell: Shell, database: WorkflowStore) -> None:
    run_id = database.create_run("checkout", {}, status="failed")
    advice = one(suggested(str(RunFailed(run_id, {"message": "card declined"}))))
    shown = shell.run(advice)
    assert shown.returncode == codes.EXIT_OK, shown.stderr
    assert run_id in shown.stdout


def test_runs_resume_for_a_step_the_reaper_gave_up(shell: Shell, database: WorkflowStore) -> None:
    # The message as the reaper writes it, its run id a placeholder filled in here.
    [template] = [t for t in _texts(PACKAGE / "integration" / "reaper.py") if "runs resume" in t]
    run_id = database.create_run("checkout", {}, wire={"type": "workflow"}, status="failed")
    advice = one([c for c in suggested(template) if c.startswith("pikku-celery runs resume")])
    shell.app_module("module")
    resumed = shell.run(advice.format(run_id))
    assert resumed.returncode == codes.EXIT_OK, resumed.stderr
    assert run_id in resumed.stdout
