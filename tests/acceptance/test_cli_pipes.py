"""The command's output into a pipe whose reader leaves early (``| head``): every command
stops quietly, no traceback and no "Exception ignored", with 141 as a shell reports SIGPIPE.

Real subprocesses on a real SQLite database; a pipe whose read end is closed before the
command starts makes its first write fail, whatever the command prints and however much.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.cli import commands as cli
from pikku_celery.cli import common as codes
from pikku_celery.cli import runs as runs_cli
from tests.support import transitions


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A database with more runs than a pipe holds as JSON, and one run with a step."""
    url = f"sqlite:///{tmp_path_factory.mktemp('pipes') / 'pipes.db'}"
    store = WorkflowStore(url)
    store.init()
    try:
        for number in range(300):
            store.create_run("bulk", {"number": number, "padding": "x" * 200})
        run_id = store.create_run("checkout", {"order": 1})
        transitions.schedule(
            store, run_id, "charge", step_id="step-1", rpc_name="shop.charge", data={}
        )
        store.attempts.record_attempt("step-1", 1, "running", task_id="step-1", worker="w@h", pid=1)
    finally:
        store.close()
    return url, run_id


def into_a_closed_pipe(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    try:
        return subprocess.run(
            [sys.executable, "-m", "pikku_celery", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "PIKKU_DATABASE_URL": url},
            check=False,
        )
    finally:
        os.close(write_end)


COMMANDS = [
    ["runs", "list"],
    ["runs", "list", "--json", "--limit", "1000"],
    ["runs", "show", "{run_id}"],
    ["runs", "show", "{run_id}", "--json"],
    ["db", "current"],
    ["db", "check"],
    ["db", "upgrade"],
    ["healthcheck"],
    ["prune", "--older-than", "1d", "--dry-run"],
    ["journal"],
    ["--help"],
    ["runs", "list", "--help"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_stops_quietly_when_its_reader_is_gone(
    seeded: tuple[str, str], command: list[str], tmp_path: Path
) -> None:
    url, run_id = seeded
    args = [part.replace("{run_id}", run_id) for part in command]
    if args[0] == "journal":
        args += ["--journal-dir", str(tmp_path / "journal")]
    result = into_a_closed_pipe(args, url)
    assert result.stderr == "", result.stderr
    if "--help" in args:  # argparse itself ignores a failed write of its help, and exits 0
        assert result.returncode in (codes.EXIT_OK, codes.EXIT_OUTPUT_CLOSED)
    else:
        assert result.returncode == codes.EXIT_OUTPUT_CLOSED == 141


def test_runs_list_json_into_head(seeded: tuple[str, str]) -> None:
    """The issue's own words: ``runs list --json | head`` ended with a BrokenPipeError."""
    url, _ = seeded
    command = shlex.join([sys.executable, "-m", "pikku_celery", "runs", "list", "--json"])
    result = subprocess.run(
        [
            "bash",
            "-c",
            f"set -o pipefail; {command} --limit 1000 2>stderr.txt | head -n 3; "
            'echo "exit $?"; cat stderr.txt',
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(url.removeprefix("sqlite:///")).parent,
        env={**os.environ, "PIKKU_DATABASE_URL": url},
        check=False,
    )
    lines = result.stdout.splitlines()
    assert lines[:3] == ["{", '  "runs": [', "    {"]
    assert lines[3:] == ["exit 141"], result.stdout  # and nothing on stderr


def test_a_reader_that_stays_gets_everything(seeded: tuple[str, str]) -> None:
    url, _ = seeded
    whole = subprocess.run(
        [sys.executable, "-m", "pikku_celery", "runs", "list", "--json", "--limit", "1000"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PIKKU_DATABASE_URL": url},
        check=False,
    )
    assert whole.returncode == codes.EXIT_OK, whole.stderr
    assert whole.stdout.count('"workflow": "bulk"') == 300


def test_a_broken_pipe_that_is_not_the_output_is_still_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")  # a broker's socket, say: stdout is fine

    monkeypatch.setattr(runs_cli, "cmd_runs_list", broken)
    assert cli.main(["runs", "list"]) == codes.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: BrokenPipeError: ") and err.count("\n") == 1
