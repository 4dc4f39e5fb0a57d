"""Runs one page's examples as one session, in a folder of its own: ``driver.py STEPS``.

STEPS is a JSON list made by ``tests/docs/test_examples.py``, in page order, each step one of:

- ``{"kind": "file", "name": ..., "code": ...}``: a Python block that is a file (``# x.py``);
- ``{"kind": "python", "code": ...}``: executed in the page's one namespace;
- ``{"kind": "command", "text": ..., "expected": [...] | null}``: run by the shell in the
  folder (``make`` in the checkout); it must exit 0 and print what ``expected`` says.
  ``$RUN_ID`` is the page's ``run_id`` (the last one its Python set). A server
  (``celery ... worker``, ``celery ... flower``, ``pikku-celery ... dashboard``) is started
  in the background, as in another terminal, and the session waits until it answers; every
  server stops when the page ends.

The process runs apart from the test suite's: a ``PikkuCelery`` installs signal handlers and
threads for its whole process. It prints what went wrong, naming the block, and exits 1.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

COMMAND_TIMEOUT = 120.0
SERVER_TIMEOUT = 60.0


class ExampleFailed(Exception):
    pass


def matches(expected: list[str], printed: str) -> bool:
    """Whether the printed lines are the expected ones: ``...`` within a line matches any
    text, and a line that is only ``...`` any number of lines."""
    pattern = ""
    for line in expected:
        if line.strip() == "...":
            pattern += r"(?:.*\n)*?"
        else:
            pattern += ".*".join(re.escape(part) for part in line.rstrip().split("...")) + r"\n"
    lines = [line.rstrip() for line in printed.rstrip("\n").split("\n")] if printed else []
    return re.fullmatch(pattern, "".join(line + "\n" for line in lines)) is not None


def _port(words: list[str], default: int) -> int:
    for i, word in enumerate(words):
        if word.startswith("--port="):
            return int(word.split("=", 1)[1])
        if word == "--port" and i + 1 < len(words):
            return int(words[i + 1])
    return default


def server_kind(words: list[str]) -> str | None:
    """What long-running process a command starts, if any."""
    if words and words[0] == "celery" and "worker" in words:
        return "worker"
    if words and words[0] == "celery" and "flower" in words:
        return "flower"
    if words and words[0] == "pikku-celery" and "dashboard" in words:
        return "dashboard"
    return None


class Session:
    def __init__(self, folder: Path, checkout: Path, broker_url: str) -> None:
        self.folder = folder
        self.checkout = checkout
        self.broker_url = broker_url
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.servers: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        run_id = self.namespace.get("run_id")
        if isinstance(run_id, str):
            env["RUN_ID"] = run_id
        return env

    def python(self, code: str, where: str) -> None:
        try:
            exec(compile(code, where, "exec"), self.namespace)
        except BaseException as exc:
            raise ExampleFailed(f"{where} raised:\n{traceback.format_exc()}") from exc

    def command(self, text: str, expected: list[str] | None, where: str) -> None:
        words = shlex.split(text, comments=True)
        kind = server_kind(words)
        if kind is not None:
            self.start_server(kind, text, words, where)
            return
        done = subprocess.run(
            text,
            shell=True,
            # `make` targets are the checkout's: they run where its Makefile is.
            cwd=self.checkout if words[:1] == ["make"] else self.folder,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
        shown = f"{where}: `{text}` exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        if done.returncode != 0:
            raise ExampleFailed(shown)
        if expected is not None and not matches(expected, done.stdout):
            raise ExampleFailed(f"{shown}\nexpected:\n" + "\n".join(expected))

    def start_server(self, kind: str, text: str, words: list[str], where: str) -> None:
        log_path = self.folder / f"{kind}-{len(self.servers)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                text,
                shell=True,
                cwd=self.folder,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped whole
            )
        self.servers.append(proc)
        (self.folder / "servers.pids").write_text("".join(f"{p.pid}\n" for p in self.servers))
        deadline = time.monotonic() + SERVER_TIMEOUT
        while not self.answers(kind, words):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ExampleFailed(
                    f"{where}: `{text}` did not come up:\n{log_path.read_text()[-4000:]}"
                )
            time.sleep(0.3)

    def answers(self, kind: str, words: list[str]) -> bool:
        if kind == "worker":
            from celery import Celery

            probe = Celery("probe", broker=self.broker_url, set_as_current=False)
            try:
                return bool(probe.control.ping(timeout=0.5))
            finally:
                probe.close()
        port = _port(words, {"flower": 5555, "dashboard": 8000}[kind])
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    def stop(self) -> None:
        for proc in self.servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.servers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> int:
    steps = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    folder = Path.cwd()
    # The page's modules are imported from its folder, as a user's are from theirs.
    sys.path[0] = str(folder)
    session = Session(
        folder, Path(os.environ["PIKKU_DOCS_CHECKOUT"]), os.environ["PIKKU_DOCS_BROKER_URL"]
    )
    try:
        for step in steps:
            if step["kind"] == "file":
                path = folder / step["name"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(step["code"], encoding="utf-8")
            elif step["kind"] == "python":
                session.python(step["code"], step["where"])
            else:
                session.command(step["text"], step["expected"], step["where"])
    except ExampleFailed as failed:
        print(failed, file=sys.stderr)
        return 1
    finally:
        session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
