"""The result backend bench's measured runs: a fresh database, worker and client per run.

Each run flushes Redis, makes its backend's database anew (pikku's migrations,
django-celery-results' ``migrate``; Celery's SQLAlchemy backend makes its own
tables), starts ``celery worker -P prefork -c 2`` and the client process, and
keeps what the client reports. The backends take turns in an order that
changes from round to round.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.harness.report import say
from bench.harness.session import Common, Runner
from bench.harness.timing import quantile
from bench.harness.turns import rotated
from bench.harness.workers import BROKER_ENV, clean_env, run_module, run_module_json, running_worker
from bench.result_backend.app import BACKEND_ENV, Backend
from bench.throughput.pools import POOLS
from pikku_celery import WorkflowStore

POOL: Final = POOLS["prefork"]
#: The measures that need a worker, in the order a round runs them.
WORKER_MEASURES: Final = ("drain", "latency", "chord")
UNITS: Final = {"drain": "tasks", "latency": "gets", "chord": "header tasks", "expiry": "rows"}


@dataclass(frozen=True)
class Settings(Common):
    counts: dict[str, int]
    backends: tuple[Backend, ...]
    expiry: tuple[Backend, ...]
    #: ``PIKKU_FLUSH_INTERVAL`` for the pikku runs; None keeps pikku's default.
    flush_interval: float | None = None


@dataclass
class Run:
    backend: str
    measure: str
    count: int
    report: dict[str, Any]

    @property
    def elapsed(self) -> float:
        return float(self.report["elapsed"])

    @property
    def rate(self) -> float:
        return self.count / self.elapsed

    def quantile(self, q: float) -> float | None:
        return quantile(self.report.get("samples", []), q)

    def cpu_ms_per_item(self) -> dict[str, float]:
        return {part: seconds * 1000 / self.count for part, seconds in self.report["cpu"].items()}


class Bench(Runner[Settings]):
    """The runs of one bench: a fresh database, worker and client each."""

    def database_url(self, backend: Backend) -> str | None:
        if backend.database is None:
            return None
        url = self.databases.fresh(backend.database)
        if backend.key == "pikku":
            store = WorkflowStore(url)
            store.init()
            store.close()
        elif backend.key == "dcr":
            run_module("bench.result_backend.dcr", [url], clean_env({}))
        return url

    def env(self, backend: Backend, database_url: str | None) -> dict[str, str]:
        settings = {BACKEND_ENV: backend.key}
        if backend.key == "pikku" and self.settings.flush_interval is not None:
            settings["PIKKU_FLUSH_INTERVAL"] = str(self.settings.flush_interval)
        return self.worker_env(settings, database_url, self.tmp / "local")

    def run(self, backend: Backend, measure: str, progress: str) -> Run:
        self.next_run()
        count = self.settings.counts[measure]
        env = self.env(backend, self.database_url(backend))
        args = ["--measure", measure, "--count", str(count)]
        if measure == "expiry":
            report = run_module_json("bench.result_backend.client", args, env)
        else:
            log = self.tmp / f"worker-{self.count}-{backend.key}-{measure}.log"
            with running_worker(
                "bench.result_backend.app", f"rbench-{backend.key}", POOL, env, env[BROKER_ENV], log
            ) as worker:
                args += ["--worker-pid", str(worker.pid)]
                report = run_module_json("bench.result_backend.client", args, env)
            self.check_log(f"{backend.key} {measure}", log, more=raised(log))
        run = Run(backend.key, measure, count, report)
        say(f"[{progress}] {backend.label:<22} {measure:<8} {describe(run)}")
        return run


def raised(log: Path) -> list[str]:
    """The exception line ending each traceback in a worker's log."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    found: list[str] = []
    inside = False
    for line in lines:
        if line.startswith("Traceback"):
            inside = True
        elif inside and line and not line[0].isspace():
            found.append(line)
            inside = False
    return found


def describe(run: Run) -> str:
    if run.measure == "latency":
        p50, p99 = run.quantile(0.5), run.quantile(0.99)
        return f"p50 {(p50 or 0) * 1000:.1f} ms, p99 {(p99 or 0) * 1000:.1f} ms"
    if run.measure == "drain":
        return f"{run.rate:.0f} tasks/s"
    return f"{run.elapsed:.2f} s for {run.count} {UNITS[run.measure]}"


def measure(bench: Bench) -> list[Run]:
    """Every run: per round, each measure with the backends in turn, then the expiry."""
    settings = bench.settings
    per_round = len(WORKER_MEASURES) * len(settings.backends) + len(settings.expiry)
    total = settings.rounds * per_round
    runs: list[Run] = []
    for round_no in range(settings.rounds):
        for measure_name in WORKER_MEASURES:
            # Rotated rather than reversed: with three or four sides, each takes each place.
            for backend in rotated(settings.backends, round_no):
                runs.append(bench.run(backend, measure_name, f"{len(runs) + 1}/{total}"))
        for backend in rotated(settings.expiry, round_no) if settings.expiry else ():
            runs.append(bench.run(backend, "expiry", f"{len(runs) + 1}/{total}"))
    return runs
