"""The migration guide (docs/celery/migration.md, "Moving to it from Redis or
django-celery-results"), run as written.

The blocks marked ``<!-- guide: moving-to-pikku -->`` are taken from the page as they are:
the app module is written to a folder, and each command of the shell block runs there, in
order, with a real ``celery worker``. Only what points at this suite's servers differs: the
database (the export's value), the broker (``CELERY_BROKER_URL``, which Celery reads before
the app's ``broker=``) and the journal folder. The guide promises results and history:
``get()`` answers, and ``runs list`` shows the task's run.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from pikku_celery import WorkflowStore
from tests.acceptance.conftest import ROOT, address, port_open, redis_db
from tests.conftest import service_missing

GUIDE = ROOT / "docs" / "celery" / "migration.md"
TITLE = "# Moving to it from Redis or django-celery-results"
MARKER = "<!-- guide: moving-to-pikku -->"
# A Redis database no other test uses: the worker consumes Celery's default queue.
BROKER_URL = redis_db(10)
BIN = Path(sys.executable).parent


def guide_blocks() -> tuple[str, list[str]]:
    """The guide's app module and its shell commands, as the page has them."""
    section = GUIDE.read_text(encoding="utf-8")
    assert section.startswith(TITLE), section[:80]
    blocks = re.findall(re.escape(MARKER) + r"\n```(\w+)\n(.*?)```", section, flags=re.DOTALL)
    assert [kind for kind, _ in blocks] == ["python", "sh"], blocks
    (_, module), (_, shell) = blocks
    commands = [line.split("  #")[0].strip() for line in shell.splitlines()]
    return module, [c for c in commands if c]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    module, _ = guide_blocks()
    first = module.splitlines()[0]
    assert first.startswith("# tasks.py"), first
    (tmp_path / "tasks.py").write_text(module, encoding="utf-8")
    return tmp_path


@pytest.fixture
def env(folder: Path, pg_server: object) -> dict[str, str]:
    host, port = address(BROKER_URL)
    if not port_open(port, host):
        service_missing("Redis", ConnectionRefusedError(f"{host}:{port}"))
    import redis

    redis.Redis.from_url(BROKER_URL).flushdb()
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(folder),
        "CELERY_BROKER_URL": BROKER_URL,
        "PIKKU_JOURNAL_DIR": str(folder / "journal"),
    }


@pytest.fixture
def worker_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_for_a_worker(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the worker answers a ping (at its default log level it never says "ready.")."""
    probe = Celery("probe", broker=BROKER_URL, set_as_current=False)
    try:
        deadline = time.monotonic() + 60
        while not probe.control.ping(timeout=0.5):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
    finally:
        probe.close()


def test_the_guide_as_written_gives_results_and_history(
    folder: Path,
    env: dict[str, str],
    pg_server: object,
    worker_processes: list[subprocess.Popen[bytes]],
) -> None:
    database = pg_server.create_database()  # type: ignore[attr-defined]
    _, commands = guide_blocks()
    outputs: dict[str, str] = {}
    for command in commands:
        words = shlex.split(command)
        if words[0] == "export":
            name, _, _value = words[1].partition("=")
            assert name == "PIKKU_DATABASE_URL", command
            env[name] = database  # this suite's database in place of the example's
            continue
        if words[:2] == ["celery", "-A"] and "worker" in words:
            log = folder / "worker.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    words,
                    cwd=folder,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: torn down whole
                )
            worker_processes.append(proc)
            wait_for_a_worker(proc, log)
            continue
        done = subprocess.run(
            command, shell=True, cwd=folder, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
        outputs[command] = done.stdout
    results = [out for command, out in outputs.items() if command.startswith("python -c")]
    assert [out.strip() for out in results] == ["5"]
    [listing] = [out for command, out in outputs.items() if "runs list" in command]
    assert "No runs yet." not in listing
    assert "tasks.add" in listing and "completed" in listing, listing
    # The run is the task's, read from SQL: its one step succeeded on its first attempt.
    store = WorkflowStore(database)
    try:
        [run] = store.list_runs()
        assert (run.workflow, run.status, run.output) == ("tasks.add", "completed", 5)
        [attempt] = store.get_run_history(run.run_id)
        assert (attempt.status, attempt.attempt) == ("succeeded", 1)
    finally:
        store.close()
