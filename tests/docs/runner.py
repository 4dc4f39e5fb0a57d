"""Runs a page's examples in a folder of its own (``driver.py``), against this suite's servers.

The examples are run as written but for where the servers are: the addresses in
``SERVERS`` stand for the suite's own (a Redis database of the docs' own, a PostgreSQL
database made for the page, free ports for the dashboard and Flower), as a user's would stand for
theirs. Pages whose commands start
a server (a Celery worker, Flower, the dashboard) run in the acceptance suite
(``tests/acceptance/test_doc_examples.py``), the others in ``tests/docs``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.docs.driver import server_kind
from tests.docs.pages import PYTHON, ROOT, SHELL, Block, Page, commands

DRIVER = Path(__file__).with_name("driver.py")
REDIS_URL = os.environ.get("PIKKU_TEST_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
# A Redis database no other suite uses: the pages' brokers.
BROKER_URL = f"{REDIS_URL}/8"
# The addresses the pages name, and what each stands for here.
REDIS_IN_PAGES = "redis://127.0.0.1:6379/0"
POSTGRES_IN_PAGES = "postgresql://postgres@127.0.0.1/shop"
# The dashboard's and Flower's ports on the pages, which another process on this machine may
# hold: each page gets free ones.
PORTS_IN_PAGES = {"8000": ("--port 8000",), "5555": ("--port=5555", "localhost:5555")}
PAGE_TIMEOUT = 300.0


def starts_servers(page: Page) -> bool:
    return any(
        server_kind(command.words) is not None
        for block in page.blocks
        if block.runs_here and block.language not in PYTHON
        for command in commands(block)
    )


def _file_name(block: Block) -> str | None:
    """``tasks.py`` for a Python block whose first line is ``# tasks.py`` (or ``# tasks.py:``,
    or a path: ``# proj/tasks.py``)."""
    first = block.code.split("\n", 1)[0]
    if first.startswith("# ") and first.split()[1].rstrip(":").endswith(".py"):
        return first.split()[1].rstrip(":")
    return None


def steps(page: Page, substitute: Callable[[str], str]) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    for block in page.blocks:
        if not block.runs_here:
            continue
        if block.language in PYTHON:
            name = _file_name(block)
            code = substitute(block.code)
            if name:
                found.append({"kind": "file", "name": name, "code": code})
            else:
                found.append({"kind": "python", "code": code, "where": block.where})
            continue
        for command in commands(block):
            if command.not_run:
                continue
            found.append(
                {
                    "kind": "command",
                    "text": substitute(command.text),
                    "expected": command.expected,
                    "where": f"{block.where} ({'shell' if block.language in SHELL else 'console'})",
                }
            )
    return found


def run_page(page: Page, folder: Path, postgres_url: Callable[[], str]) -> None:
    """Every example of the page that runs here, in order, in ``folder``; fails the test
    with what the driver said when one does not do what the page says."""
    import redis

    redis.Redis.from_url(BROKER_URL).flushdb()
    database: list[str] = []
    ports = {port: str(free_port()) for port in PORTS_IN_PAGES}

    def substitute(text: str) -> str:
        if POSTGRES_IN_PAGES in text and not database:
            database.append(postgres_url())
        text = text.replace(REDIS_IN_PAGES, BROKER_URL)
        for port, spellings in PORTS_IN_PAGES.items():
            for spelling in spellings:
                text = text.replace(spelling, spelling.replace(port, ports[port]))
        return text.replace(POSTGRES_IN_PAGES, database[0]) if database else text

    plan = folder / "steps.json"
    plan.write_text(json.dumps(steps(page, substitute)), encoding="utf-8")
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PIKKU_")},
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(folder),
        "PIKKU_JOURNAL_DIR": str(folder / "journal"),
        "PIKKU_DOCS_BROKER_URL": BROKER_URL,
        "PIKKU_DOCS_CHECKOUT": str(ROOT),
    }
    try:
        done = subprocess.run(
            [sys.executable, str(DRIVER), str(plan)],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=PAGE_TIMEOUT,
        )
    finally:
        _stop_left_servers(folder)
    assert done.returncode == 0, f"{page.name}:\n{done.stderr[-8000:]}\n{done.stdout[-2000:]}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _stop_left_servers(folder: Path) -> None:
    """Servers of a driver that was killed (a timeout) would outlive it: stop them."""
    pids = folder / "servers.pids"
    if not pids.exists():
        return
    for pid in pids.read_text().split():
        try:
            os.killpg(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
