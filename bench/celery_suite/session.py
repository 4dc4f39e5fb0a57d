"""One mode: a fresh database and journal, the suite in a pytest process, its records read."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bench.celery_suite import plugin
from bench.celery_suite.sources import SUITE_FILES, Sources
from bench.harness.broker import flush
from bench.harness.postgres import BenchDatabases
from bench.harness.workers import ROOT, clean_env

__all__ = [
    "BACKEND_ALIAS",
    "MODES",
    "ModeRun",
    "PikkuSource",
    "Settings",
    "backend_url",
    "pikku_source",
    "redis_helpers_env",
    "run_mode",
]

MODES: Final = ("plain", "all", "steps", "backend")
#: The scheme the ``backend`` mode's result backend URL goes by when the suite's gates are
#: open: it starts with ``redis`` (the gates' test), and the plugin makes it pikku-celery's
#: ``PikkuBackend`` on the suite's apps. Without ``+``, as Celery splits the scheme there.
BACKEND_ALIAS: Final = "redispikku"
# Nothing from the caller's shell may change what a mode runs: no PIKKU_* (a
# PIKKU_MIRROR=all would turn "steps" into "all"), no TEST_* of Celery's conftest.
SHELL_PREFIXES: Final = ("PIKKU_", "TEST_", "CELERY_", "WORKER_LOGLEVEL", "REDIS_")
#: The line the embedded worker's teardown raises when its thread outlives shutdown_timeout.
WORKER_STUCK: Final = "Worker thread failed to exit within the allocated timeout"
# The suite's process: the helper packages after the virtualenv's, then pytest's own main.
_LAUNCH: Final = (
    "import sys; sys.path.append(sys.argv.pop(1)); import pytest; raise SystemExit(pytest.main())"
)


@dataclass(frozen=True)
class PikkuSource:
    """Which pikku-celery the mirrored modes run: a snapshot of a commit, or the work tree.

    Others may be editing ``pikku_celery/`` in this work tree while a mode runs for
    minutes; a snapshot (``git archive`` of the commit into the cache) keeps one mode on one
    version of the code. ``path`` goes first on the suite's ``PYTHONPATH``.
    """

    label: str  # "commit <sha>" or "work tree at <sha> (+ N changed files)"
    commit: str
    path: Path | None  # None: the work tree (the virtualenv's editable install)
    changed_files: tuple[str, ...] = ()

    @property
    def pythonpath(self) -> str:
        return str(ROOT) if self.path is None else f"{self.path}{os.pathsep}{ROOT}"


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def pikku_source(spec: str, cache: Path) -> PikkuSource:
    """``worktree``, or a commit (``HEAD``, a sha, a branch) exported into ``cache``."""
    if spec == "worktree":
        commit = _git("rev-parse", "HEAD")
        changed = tuple(
            line[3:] for line in _git("status", "--porcelain", "--", "pikku_celery").splitlines()
        )
        label = f"work tree at {commit[:12]}" + (
            f" + {len(changed)} changed paths under pikku_celery/" if changed else ""
        )
        return PikkuSource(label, commit, None, changed)
    commit = _git("rev-parse", "--verify", f"{spec}^{{commit}}")
    path = cache / "pikku" / commit
    if not (path / "pikku_celery" / "__init__.py").exists():
        partial = path.with_name(commit + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit, "pikku_celery"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(partial, filter="data")
        shutil.rmtree(path, ignore_errors=True)
        partial.replace(path)
    return PikkuSource(f"commit {commit[:12]}", commit, path)


@dataclass(frozen=True)
class Settings:
    out: Path  # this invocation's folder
    redis_url: str
    database: str  # "sqlite" or "postgresql"
    pg_url: str
    timeout: float  # the whole pytest session, per mode
    test_timeout: float  # pytest-timeout, per test
    settle: float
    pikku: PikkuSource
    tests: tuple[str, ...] = SUITE_FILES
    pytest_args: tuple[str, ...] = ()
    # The backend mode: "open" runs the tests that require a result_backend starting with
    # "redis" (through BACKEND_ALIAS), "closed" names the backend pikku+<database>.
    gates: str = "open"
    # Databases are named <pg_prefix>_<mode>: two invocations at once need two prefixes.
    pg_prefix: str = "pikku_celery_suite"


@dataclass
class ModeRun:
    mode: str
    folder: Path
    database_url: str | None
    journal_dir: Path | None
    returncode: int | None
    timed_out: bool
    started: float
    ended: float
    session: dict[str, Any]
    reports: list[dict[str, Any]]
    preruns: list[dict[str, Any]]
    pikku_logs: list[dict[str, Any]]
    summary_line: str
    worker_stuck_lines: int
    leftover_processes: int
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def redis_helpers_env(url: str) -> dict[str, str]:
    """``REDIS_HOST``/``REDIS_PORT`` for the suite's own Redis client (``get_redis_connection``
    in ``t/integration/tasks.py``, database 0): the server of ``url``. Its tests that read
    what the Redis backend keeps (pub/sub channels, a chord's keys) look there, and its
    tasks' own keys stay off any other server."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return {"REDIS_HOST": parts.hostname or "localhost", "REDIS_PORT": str(parts.port or 6379)}


def _fresh_database(settings: Settings, mode: str, folder: Path) -> str:
    if settings.database == "sqlite":
        return f"sqlite:///{folder / 'pikku.db'}"
    name = f"{settings.pg_prefix}_{mode}"
    # Kept after the mode (its records are read from it), so never dropped here.
    return BenchDatabases(settings.pg_url, (name,)).fresh(name)


def _upgrade(url: str, pikku: PikkuSource) -> None:
    command = [sys.executable, "-m", "pikku_celery", "--database-url", url, "db", "upgrade"]
    env = clean_env({"PYTHONPATH": pikku.pythonpath}, SHELL_PREFIXES)
    subprocess.run(command, check=True, cwd=ROOT, env=env, capture_output=True)


def backend_url(database_url: str, gates: str) -> str:
    """The ``backend`` mode's ``TEST_BACKEND``: pikku-celery's result backend on the mode's
    database, its scheme starting with ``redis`` when the gates are open."""
    if gates not in ("open", "closed"):
        raise ValueError(f"gates must be 'open' or 'closed', not {gates!r}")
    scheme = BACKEND_ALIAS if gates == "open" else "pikku"
    return f"{scheme}+{database_url}"


def _jsonl(folder: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    if folder.is_dir():
        for path in sorted(folder.glob("*.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    records.append(json.loads(line))
    return records


def _summary_line(log: str) -> str:
    for line in reversed(log.splitlines()):
        text = line.strip().strip("=").strip()
        if " in " in text and any(w in text for w in ("passed", "failed", "error", "skipped")):
            return text
    return ""


def _process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _count_group(pgid: int) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # after the state and the ppid: the process group
            count += 1
    return count


def run_mode(mode: str, sources: Sources, settings: Settings) -> ModeRun:
    folder = settings.out / mode
    folder.mkdir(parents=True, exist_ok=False)
    records = folder / "records"
    records.mkdir()
    flush(settings.redis_url)
    env_settings = {
        "TEST_BROKER": settings.redis_url,
        "TEST_BACKEND": settings.redis_url,
        "PYTHONPATH": str(ROOT) if mode == "plain" else settings.pikku.pythonpath,
        "PYTHONUNBUFFERED": "1",
        plugin.ENV_MODE: mode,
        plugin.ENV_OUT: str(records),
        plugin.ENV_SETTLE: str(settings.settle),
        **redis_helpers_env(settings.redis_url),
    }
    database_url: str | None = None
    journal_dir: Path | None = None
    if mode != "plain":
        database_url = _fresh_database(settings, mode, folder)
        _upgrade(database_url, settings.pikku)
        journal_dir = folder / "journal"
        journal_dir.mkdir()
        env_settings[plugin.ENV_DATABASE_URL] = database_url
        env_settings["PIKKU_JOURNAL_DIR"] = str(journal_dir)
    if mode == "backend" and database_url is not None:
        env_settings["TEST_BACKEND"] = backend_url(database_url, settings.gates)
        if settings.gates == "open":
            env_settings[plugin.ENV_BACKEND_ALIAS] = BACKEND_ALIAS
    command = [
        sys.executable,
        "-c",
        _LAUNCH,
        str(sources.site),
        *settings.tests,
        "-p",
        "bench.celery_suite.plugin",
        "-p",
        "no:pikku_celery",
        "-p",
        "no:cacheprovider",
        "--timeout",
        str(settings.test_timeout),
        "-q",
        "-rfEs",
        *settings.pytest_args,
    ]
    log_path = folder / "pytest.log"
    print(f"[{mode}] running the suite; output in {log_path}", flush=True)
    started = time.time()
    timed_out = False
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=sources.root,
            env=clean_env(env_settings, SHELL_PREFIXES),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            process.wait(timeout=settings.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    ended = time.time()
    notes: list[str] = []
    # Pool children or other processes the session left behind in its process group.
    leftover = 0
    if _process_group_alive(process.pid):
        time.sleep(2)
        leftover = _count_group(process.pid)
        if leftover:
            notes.append(f"{leftover} processes of the session's group outlived it; killed")
            os.killpg(process.pid, signal.SIGKILL)
    stacks = records / "exit-stacks.txt"
    if stacks.exists() and stacks.stat().st_size:
        notes.append(f"the process was still exiting 3 s after pytest's last hook: {stacks}")
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    session_path = records / "session.json"
    session: dict[str, Any] = (
        json.loads(session_path.read_text(encoding="utf-8")) if session_path.exists() else {}
    )
    return ModeRun(
        mode=mode,
        folder=folder,
        database_url=database_url,
        journal_dir=journal_dir,
        returncode=process.returncode,
        timed_out=timed_out,
        started=started,
        ended=ended,
        session=session,
        reports=_jsonl(records / "reports"),
        preruns=_jsonl(records / "prerun"),
        pikku_logs=_jsonl(records / "logs"),
        summary_line=_summary_line(log_text),
        worker_stuck_lines=log_text.count(WORKER_STUCK),
        leftover_processes=leftover,
        notes=notes,
    )
