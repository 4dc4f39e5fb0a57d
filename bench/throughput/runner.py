"""The Celery bench's timed runs: a fresh worker and publisher per run, in rounds.

Each run flushes Redis, empties its database, starts ``celery worker`` and the
publisher process from the scenario's environment, then gathers what they and
the mirror report into a ``Run``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.harness.delivery import load_delivery
from bench.harness.mirror import clear_mirror
from bench.harness.report import say
from bench.harness.session import Common, Runner
from bench.harness.turns import alternated
from bench.harness.workers import BROKER_ENV, run_module_json, running_worker
from bench.throughput.app import (
    ATTEMPTS,
    BY_KEY,
    LOCAL_ENV,
    MATRIX,
    SCENARIO_ENV,
    STATS_ENV,
    VARIANT_LABELS,
    VARIANTS,
    Scenario,
)
from bench.throughput.pools import POOL_LABELS, POOL_SCENARIOS, POOLS
from bench.throughput.runs import Run
from pikku_celery import WorkflowStore


@dataclass(frozen=True)
class Settings(Common):
    tasks: int
    pools: tuple[str, ...]


class Bench(Runner[Settings]):
    """The runs of one bench: a worker and a publisher each."""

    def database_url(self, scenario: Scenario) -> str | None:
        if scenario.database is None:
            return None
        if scenario.database == "sqlite":
            path = self.tmp / f"bench-{self.count}.db"
            url = f"sqlite:///{path}"
            store = WorkflowStore(url)
            store.init()
            store.close()
            return url
        url = self.databases.url(scenario.database)
        if scenario.mirror:
            clear_mirror(url)
        return url

    def run(self, scenario: Scenario, variant: str, pool: str, round_no: int, progress: str) -> Run:
        count = self.next_run()
        database_url = self.database_url(scenario)
        stats_dir = self.tmp / f"stats-{count}"
        local = self.tmp / "local"
        env = self.worker_env(
            {SCENARIO_ENV: scenario.key, STATS_ENV: str(stats_dir), LOCAL_ENV: str(local)},
            database_url,
            local,
        )
        log = self.tmp / f"worker-{count}-{scenario.key}-{variant}-{pool}.log"
        run_key = f"bench:{scenario.key}:{variant}:{pool}:{round_no}"
        pg_database = scenario.database if scenario.database not in (None, "sqlite") else None
        before = self.databases.commits(pg_database) if pg_database else None
        with running_worker(
            "bench.throughput.app", f"bench-{scenario.key}", POOLS[pool], env, env[BROKER_ENV], log
        ) as worker:
            args = ["--variant", variant, "--tasks", str(self.settings.tasks), "--run", run_key]
            args += ["--worker-pid", str(worker.pid)]
            report = run_module_json("bench.throughput.publisher", args, env)
            check = None
            if scenario.mirror and database_url is not None:
                check = self.check_mirror(
                    database_url, run_key, self.settings.tasks, ATTEMPTS[variant]
                )
        commits = None
        if pg_database is not None and before is not None:
            commits = self.databases.commits(pg_database) - before
        delivery = load_delivery(stats_dir) if scenario.mirror else None
        self.check_log(run_key, log)
        if report.get("forced_events") and not scenario.events:
            self.session.notes.add(
                "PikkuCelery switched the task events on; the bench turned them off for (c)."
            )
        run = Run(
            scenario.key,
            variant,
            pool,
            self.settings.tasks,
            report["elapsed"],
            report["worker_elapsed"],
            report["publish"],
            report["cpu"],
            commits,
            delivery,
            check,
        )
        say(progress_line(run, scenario, round_no, progress))
        return run


def progress_line(run: Run, scenario: Scenario, round_no: int, progress: str) -> str:
    """One run's figures as it ends: a full run takes minutes, so each says how it went."""
    line = (
        f"[{progress}] round {round_no + 1}  {POOL_LABELS[run.pool]:<12} {scenario.label:<24} "
        f"{VARIANT_LABELS[run.variant]:<10} {run.rate:8.1f} tasks/s"
    )
    if run.commits_per_task is not None:
        line += f"  {run.commits_per_task:.2f} commits/task"
    if run.delivery is not None:
        p99 = run.delivery.lag(0.99)
        line += f"  settle {run.settle * 1000:.0f} ms, lag p99 " + (
            f"{p99 * 1000:.1f} ms" if p99 is not None else "n/a"
        )
    if run.check is not None:
        line += f"  mirror: {run.check}"
    return line


def measure(bench: Bench) -> list[Run]:
    """Every timed run: the prefork matrix and SQLite, then the other pools."""
    plan: list[tuple[Scenario, str, str]] = []
    if "prefork" in bench.settings.pools:
        plan += [(scenario, variant, "prefork") for scenario in MATRIX for variant in VARIANTS]
        plan.append((BY_KEY["pikku_sqlite"], "noop", "prefork"))
    for pool in bench.settings.pools:
        if pool != "prefork":
            plan += [(BY_KEY[key], "noop", pool) for key in POOL_SCENARIOS]
    runs: list[Run] = []
    total = len(plan) * bench.settings.rounds
    for round_no in range(bench.settings.rounds):
        # Alternating the order keeps a slow start or a warm cache off one scenario.
        for scenario, variant, pool in alternated(plan, round_no):
            runs.append(bench.run(scenario, variant, pool, round_no, f"{len(runs) + 1}/{total}"))
    return runs
