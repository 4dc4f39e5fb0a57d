"""An interrupted test session leaves no worker and no test database behind.

A session is started in a subprocess on ``interrupted_case.py``, whose worker fixture
waits for a worker that never gets ready; once the worker runs, the session gets SIGINT
(Ctrl-C) or SIGTERM (a CI timeout, ``kill``). Its fixtures' cleanup must stop the worker's
whole process group and drop the session's databases.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.acceptance.conftest import ROOT
from tests.conftest import PG_ADMIN_URL, PgServer

# Runs in the worker's interpreter before anything else: says who it is and which
# database its session made, then waits as a worker that never gets ready would.
SITECUSTOMIZE = """
import os, pathlib, time

marker = pathlib.Path(os.environ["INTERRUPTED_MARKER"])
marker.write_text(f"{os.getpid()}\\n{os.environ['SHOP_DATABASE_URL']}")
while True:
    time.sleep(0.1)
"""


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a reaped-late child counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_session_stops_its_worker_and_drops_its_databases(
    tmp_path: Path, pg_server: PgServer, signum: signal.Signals
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    marker = tmp_path / "worker.txt"
    env = {
        **os.environ,
        "INTERRUPTED_SITE": str(site),
        "INTERRUPTED_MARKER": str(marker),
        "PYTHONPATH": str(ROOT),
    }
    case = "tests/acceptance/interrupted_case.py"
    command = [sys.executable, "-m", "pytest", case, "-p", "no:cacheprovider", "-q"]
    command += ["--basetemp", str(tmp_path / "session")]
    with (tmp_path / "session.log").open("wb") as out:
        session = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() or "\n" not in marker.read_text():
            assert session.poll() is None, (tmp_path / "session.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "session.log").read_text()
            time.sleep(0.05)
        pid_line, database_url = marker.read_text().split("\n", 1)
        worker = int(pid_line)
        assert running(worker)
        session.send_signal(signum)
        session.wait(timeout=60)
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    log = (tmp_path / "session.log").read_text()
    assert session.returncode == pytest.ExitCode.INTERRUPTED, log
    assert not running(worker) and not group_members(worker), log
    name = sa.make_url(database_url).database
    admin = sa.create_engine(PG_ADMIN_URL)
    try:
        with admin.connect() as conn:
            left = conn.exec_driver_sql(
                "SELECT datname FROM pg_database WHERE datname = %(n)s", {"n": name}
            ).all()
    finally:
        admin.dispose()
    assert left == [], log
