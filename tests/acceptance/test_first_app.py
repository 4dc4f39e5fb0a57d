"""The README's "Your first app", run as a new user runs it: its file, then its commands.

The one change is the broker's Redis database, which is the suite's own here.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.acceptance.conftest import REDIS_URL, ROOT, address, port_open, redis_db
from tests.conftest import service_missing


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Your first app")
    return text[start : text.index("\n## ", start + 1)]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def test_the_first_app_of_the_readme_runs_as_written(tmp_path: Path) -> None:
    host, port = address(REDIS_URL)
    if not port_open(port, host):
        service_missing("Redis", ConnectionRefusedError(f"{host}:{port}"))
    section = _section()
    [code] = _blocks(section, "python")
    [commands] = _blocks(section, "sh")
    assert 'broker="redis://127.0.0.1:6379/0"' in code
    (tmp_path / "tasks.py").write_text(code.replace("redis://127.0.0.1:6379/0", redis_db(11)))
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PIKKU_")},
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(tmp_path),
        "PIKKU_JOURNAL_DIR": str(tmp_path / "journal"),
    }
    lines = [line.split("#", 1)[0].strip() for line in commands.strip().splitlines()]
    upgrade, worker_line, publish, listing = (shlex.split(line) for line in lines)

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        return done

    run(upgrade)
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [*worker_line, "-P", "solo"],  # one process is enough here
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        run_id = run(publish).stdout.strip()
        deadline = time.monotonic() + 60
        while True:
            shown = run(listing).stdout
            if run_id in shown and "completed" in shown:
                break
            assert time.monotonic() < deadline, (shown, (tmp_path / "worker.log").read_text())
            time.sleep(0.5)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        log.close()
