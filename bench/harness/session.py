"""One benchmark's run from start to end: its databases, scratch folder and verdicts.

Every Celery bench creates its PostgreSQL databases and a scratch folder,
flushes its Redis database, and however it ends drops and removes them again;
at the end it lists what it noted, the targets missed and the problems, and
its exit code says whether any were found. ``Runner`` is what the benches'
timed runs share: the session, a run counter and the worker's environment.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Generic, TypeVar

from bench.harness.broker import flush
from bench.harness.mirror import check_run
from bench.harness.postgres import BenchDatabases
from bench.harness.report import say
from bench.harness.workers import BROKER_ENV, DATABASE_ENV, clean_env, mirror_failures

__all__ = ["Common", "Runner", "Servers", "Session"]


@dataclass(frozen=True)
class Servers:
    """Where a bench makes its databases and finds its broker."""

    pg_url: str
    redis_url: str


@dataclass(frozen=True)
class Common(Servers):
    """The settings every Celery bench takes; each bench's ``Settings`` adds its own."""

    rounds: int


class Session:
    """A bench's databases on ``pg_url``'s server and its scratch folder, for a ``with``."""

    def __init__(
        self, prefix: str, settings: Servers, databases: Sequence[str], *, create: bool = True
    ) -> None:
        self.started = time.perf_counter()
        self.redis_url = settings.redis_url
        self.databases = BenchDatabases(settings.pg_url, databases)
        self._create = create
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        #: Kept when there are problems, so their logs can be read.
        self.keep_tmp = False
        self.problems: list[str] = []
        self.notes: set[str] = set()
        self.missed: list[str] = []

    def __enter__(self) -> Session:
        flush(self.redis_url)
        if self._create:
            self.databases.create()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        flush(self.redis_url)
        self.databases.drop()
        if not (self.keep_tmp and self.problems):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def finish(self, *, check: bool) -> int:
        """Say what was noted, missed and wrong; the exit code (1: a problem, or a target
        missed when ``check``)."""
        say()
        for note in sorted(self.notes):
            say(f"NOTE: {note}")
        for target in self.missed:
            say(f"TARGET MISSED: {target}")
        for problem in self.problems:
            say(f"PROBLEM: {problem}")
        if self.problems and self.keep_tmp:
            say(f"(the workers' logs are kept in {self.tmp})")
        say(f"done in {time.perf_counter() - self.started:.0f} s")
        return 1 if self.problems or (check and self.missed) else 0


S = TypeVar("S", bound=Common)


@dataclass
class Runner(Generic[S]):
    """What a bench's timed runs share: its settings, the session and a run counter."""

    settings: S
    session: Session
    count: int = 0

    @property
    def databases(self) -> BenchDatabases:
        return self.session.databases

    @property
    def tmp(self) -> Path:
        return self.session.tmp

    @property
    def problems(self) -> list[str]:
        return self.session.problems

    def next_run(self) -> int:
        """The new run's number, with Redis emptied of the last run's messages and counters."""
        self.count += 1
        flush(self.settings.redis_url)
        return self.count

    def worker_env(
        self, settings: Mapping[str, str], database_url: str | None, local: Path
    ) -> dict[str, str]:
        """A clean environment for a run's worker and client: ``settings``, the broker, the
        database if any, and ``local`` as the mirror's spool and journal folder."""
        env = {
            **settings,
            BROKER_ENV: self.settings.redis_url,
            "PIKKU_SPOOL_DIR": str(local),
            "PIKKU_JOURNAL_DIR": str(local),
        }
        if database_url is not None:
            env[DATABASE_ENV] = database_url
        return clean_env(env)

    def check_mirror(self, url: str, run: str, tasks: int, attempts_per_step: int) -> str:
        """What the mirror recorded of the run, a problem unless it is every task's."""
        check = check_run(url, run, tasks, attempts_per_step)
        if not check.ok:
            self.problems.append(f"{run}: {check.describe()}")
        return check.describe()

    def check_log(self, run: str, log: Path, *also: str, more: Sequence[str] = ()) -> None:
        """A problem for a run whose worker logged a mirror failure (or ``also``, or has
        ``more`` failures found otherwise)."""
        failures = list(dict.fromkeys([*mirror_failures(log, *also), *more]))
        if failures:
            self.problems.append(
                f"{run}: the worker logged {len(failures)} failures: " + "; ".join(failures[:3])
            )
