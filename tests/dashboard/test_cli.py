"""``pikku-celery dashboard``: options from the environment, its address bound before it says
it serves (a taken port is one line and its own exit code), and a clear word without the extra."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
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


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What uvicorn was asked to serve, instead of serving it."""
    asked: dict[str, Any] = {}

    def fake_run(server: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        assert sockets is not None
        asked.update(config=server.config, address=sockets[0].getsockname())

    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    return asked


@pytest.fixture
def database(tmp_path: Path) -> str:
    (tmp_path / "cli.db").touch()  # the dashboard reads a database, it never creates one
    return f"sqlite:///{tmp_path / 'cli.db'}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_serves_with_settings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
    served: dict[str, Any],
    database: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    monkeypatch.setenv("PIKKU_DASHBOARD_PORT", str(port))
    monkeypatch.setenv("PIKKU_FLOWER_URL", "http://flower.example:5555")
    monkeypatch.setenv("PIKKU_DASHBOARD_PASSWORD", "pw")
    code = cli.main(["--database-url", database, "dashboard", "--host", "0.0.0.0"])
    assert code == codes.EXIT_OK
    assert (served["config"].host, served["config"].port) == ("0.0.0.0", port)
    assert served["address"] == ("0.0.0.0", port)  # bound before uvicorn was asked
    out = capsys.readouterr().out
    assert f"on http://0.0.0.0:{port}/" in out and "sign in" in out


def test_a_port_in_use_is_one_line_naming_it_and_exit_4_with_no_url(
    served: dict[str, Any], database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["--database-url", database, "dashboard", "--port", str(port)])
    assert code == codes.EXIT_CANNOT_LISTEN == 4
    assert code != codes.EXIT_SCHEMA_BEHIND
    out, err = capsys.readouterr()
    assert out == ""  # no URL for a dashboard that is not there
    assert err.count("\n") == 1 and err.startswith(f"error: cannot listen on 127.0.0.1:{port}: ")
    assert f"port {port} is in use" in err and "PIKKU_DASHBOARD_PORT" in err
    assert "Traceback" not in err
    assert served == {}


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_that_is_none_is_a_usage_error_naming_the_variable(
    served: dict[str, Any],
    database: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    port: str,
) -> None:
    for given, env in ((["--port", port], None), ([], port)):
        if env is not None:
            monkeypatch.setenv("PIKKU_DASHBOARD_PORT", env)
        with pytest.raises(SystemExit) as stopped:
            cli.main(["--database-url", database, "dashboard", *given])
        assert stopped.value.code == codes.EXIT_USAGE
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert f"{port!r} is not a port" in err and "PIKKU_DASHBOARD_PORT" in err, err
    assert served == {}


def test_a_host_that_is_not_here_is_one_line_and_exit_4(
    served: dict[str, Any], database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 192.0.2.0/24 is reserved for documentation: never an address of this machine.
    code = cli.main(["--database-url", database, "dashboard", "--host", "192.0.2.7"])
    assert code == codes.EXIT_CANNOT_LISTEN
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: cannot listen on 192.0.2.7:8000: ") and "--host" in err
    assert served == {}


def test_the_real_server_answers_at_the_url_it_prints(database: str) -> None:
    """A subprocess, as a user starts it: the URL comes once the port is bound, and answers."""
    server = subprocess.Popen(
        [sys.executable, "-m", "pikku_celery", "--database-url", database, "dashboard"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PIKKU_DASHBOARD_PORT": "0"},
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:(\d+)/) \(read-only\)$", line.strip())
        assert match, line
        with urllib.request.urlopen(match.group(1) + "healthz", timeout=10) as answer:
            assert answer.status == 200
        # A second dashboard on the same port: the distinct code, and no URL.
        again = subprocess.run(
            [sys.executable, "-m", "pikku_celery", "--database-url", database, "dashboard"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PIKKU_DASHBOARD_PORT": match.group(2)},
            check=False,
        )
        assert again.returncode == codes.EXIT_CANNOT_LISTEN, again.stderr
        assert again.stdout == "" and again.stderr.count("\n") == 1
        assert "PIKKU_DASHBOARD_PORT" in again.stderr
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    # uvicorn shuts down, then lets the signal end the process, as a supervisor expects.
    assert server.returncode in (0, -signal.SIGTERM), stderr
    assert "Traceback" not in stderr


def test_a_bad_flower_url_is_a_clear_error(
    served: dict[str, Any], database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        ["--database-url", database, "dashboard", "--flower-url", "javascript:alert(1)"]
    )
    assert code == codes.EXIT_ERROR
    assert "http(s) address" in capsys.readouterr().err


def test_without_the_extra_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if it were not installed
    assert cli.main(["dashboard"]) == codes.EXIT_ERROR
    assert "Run `pip install pikku-celery[dashboard]`." in capsys.readouterr().err
