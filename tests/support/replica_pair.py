"""A scratch PostgreSQL primary and its streaming replica, made with the Debian cluster tools.

``pg_createcluster`` makes each cluster (run as root, the tools act as the ``postgres``
user); the replica's data folder is emptied and filled by ``pg_basebackup -R`` from the
primary, so it starts in recovery and streams. Both clusters are dropped by ``stop()``,
whatever state they are in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

import sqlalchemy as sa

from tests.support.http import free_port

__all__ = ["PairUnavailable", "ReplicaPair"]

_HOST = "127.0.0.1"
_STREAMING_TIMEOUT = 60.0
_COMMAND_TIMEOUT = 120.0
_LOG_TAIL_LINES = 30
# Nothing here needs to survive a crash of the machine; the pair is made and gone in a run.
_FAST = ("-o", "fsync=off")
# Trust for local and TCP connections, replication included (initdb's pg_hba has lines
# for both): the pair lives on 127.0.0.1 for the length of a test session.
_TRUST = ("--", "--auth-local=trust", "--auth-host=trust")


class PairUnavailable(RuntimeError):
    """The pair could not be made: the tools are missing, or a step failed (its output and
    the cluster's log are in the message)."""


class ReplicaPair:
    """A primary on one free port and a replica streaming from it on another."""

    def __init__(self, version: str | None = None) -> None:
        self.version = version or _installed_version()
        tag = uuid.uuid4().hex[:8]
        self.primary_name = f"pikku_primary_{tag}"
        self.replica_name = f"pikku_replica_{tag}"
        self.primary_port = free_port()
        self.replica_port = free_port()
        self._made: list[str] = []

    def url(self, port: int, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@{_HOST}:{port}/{database}"

    def primary_url(self, database: str = "postgres") -> str:
        return self.url(self.primary_port, database)

    def replica_url(self, database: str = "postgres") -> str:
        return self.url(self.replica_port, database)

    def start(self) -> None:
        for tool in ("pg_createcluster", "pg_ctlcluster", "pg_dropcluster", "pg_basebackup"):
            if shutil.which(tool) is None:
                raise PairUnavailable(
                    f"{tool} is not on PATH: install postgresql-common and the PostgreSQL "
                    "server (apt-get install postgresql) to make a primary and a replica"
                )
        try:
            self._make(
                self.primary_name,
                self.primary_port,
                "-o",
                "wal_level=replica",
                "-o",
                "max_wal_senders=4",
            )
            self._ctl(self.primary_name, "start")
            self._make(self.replica_name, self.replica_port, "-o", "hot_standby=on")
            folder = Path(self._data_directory(self.replica_name))
            for entry in folder.iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            # As the cluster's owner, so the copied files are its own.
            self._run(
                "runuser",
                "-u",
                "postgres",
                "--",
                "pg_basebackup",
                "-h",
                _HOST,
                "-p",
                str(self.primary_port),
                "-U",
                "postgres",
                "-D",
                str(folder),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            )
            self._ctl(self.replica_name, "start")
            self.wait_until_streaming()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Drop both clusters (stopped first); goes on past a failure, to drop the other."""
        problems = []
        for name in reversed(self._made):
            done = subprocess.run(
                ["pg_dropcluster", "--stop", self.version, name],
                capture_output=True,
                text=True,
                timeout=_COMMAND_TIMEOUT,
                check=False,
            )
            if done.returncode != 0:
                problems.append(f"pg_dropcluster {name}: {done.stderr.strip()}")
        self._made.clear()
        if problems:
            raise PairUnavailable("; ".join(problems))

    def wait_until_streaming(self) -> None:
        """Until the replica is in recovery and its WAL receiver streams from the primary."""
        engine = sa.create_engine(self.replica_url(), poolclass=sa.NullPool)
        deadline = time.monotonic() + _STREAMING_TIMEOUT
        last = "no answer"
        try:
            while time.monotonic() < deadline:
                try:
                    with engine.connect() as conn:
                        row = conn.exec_driver_sql(
                            "SELECT pg_is_in_recovery(), (SELECT status FROM pg_stat_wal_receiver)"
                        ).one()
                except sa.exc.OperationalError as exc:
                    last = str(exc.orig).strip().splitlines()[0]
                else:
                    if row[0] and row[1] == "streaming":
                        return
                    last = f"in recovery: {row[0]}, WAL receiver: {row[1]}"
                time.sleep(0.1)
        finally:
            engine.dispose()
        raise PairUnavailable(
            f"the replica on port {self.replica_port} did not stream within "
            f"{_STREAMING_TIMEOUT:g} s ({last}):\n{self.log_tail(self.replica_name)}"
        )

    def log_tail(self, name: str) -> str:
        path = Path(f"/var/log/postgresql/postgresql-{self.version}-{name}.log")
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])

    def __enter__(self) -> ReplicaPair:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _make(self, name: str, port: int, *options: str) -> None:
        # Recorded before it runs: a half-made cluster is dropped too.
        self._made.append(name)
        self._run(
            "pg_createcluster", self.version, name, "-p", str(port), *options, *_FAST, *_TRUST
        )

    def _ctl(self, name: str, action: str) -> None:
        try:
            self._run("pg_ctlcluster", "--skip-systemctl-redirect", self.version, name, action)
        except PairUnavailable as exc:
            raise PairUnavailable(f"{exc}\n{self.log_tail(name)}") from None

    def _data_directory(self, name: str) -> str:
        return self._run("pg_conftool", "-s", self.version, name, "show", "data_directory").strip()

    @staticmethod
    def _run(*command: str) -> str:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT,
            check=False,
            env={**os.environ, "LC_ALL": "C.UTF-8"},
        )
        if done.returncode != 0:
            raise PairUnavailable(
                f"`{' '.join(command)}` exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        return done.stdout


def _installed_version() -> str:
    """The newest PostgreSQL server installed for the cluster tools (``15`` here)."""
    root = Path("/usr/lib/postgresql")
    versions = (
        sorted(
            (p.name for p in root.iterdir() if (p / "bin" / "postgres").exists()),
            key=lambda name: tuple(int(part) for part in name.split(".") if part.isdigit()),
        )
        if root.is_dir()
        else []
    )
    if not versions:
        raise PairUnavailable(
            "no PostgreSQL server is installed under /usr/lib/postgresql: install one "
            "(apt-get install postgresql) to make a primary and a replica"
        )
    return versions[-1]
