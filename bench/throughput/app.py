"""The Celery app of the Celery benchmark: one scenario's tasks, built from the environment.

``celery -A bench.throughput.app worker`` builds the scenario named by
``BENCH_SCENARIO`` at import; the publisher process imports the same app, so
both sides carry exactly the scenario's settings and signal handlers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from celery import Celery, signals

from bench.harness.broker import DEFAULT_REDIS_URL, redis_client
from bench.harness.delivery import StatsRecorder
from bench.harness.workers import BROKER_ENV, DATABASE_ENV
from pikku_celery import PikkuCelery

SCENARIO_ENV: Final = "BENCH_SCENARIO"
STATS_ENV: Final = "BENCH_STATS_DIR"
LOCAL_ENV: Final = "BENCH_LOCAL_DIR"

MIRROR_DATABASE: Final = "pikku_bench_mirror"
RESULTS_DATABASE: Final = "pikku_bench_results"

WARMUP_TASKS: Final = 50
VARIANTS: Final = ("noop", "retry")
VARIANT_LABELS: Final = {"noop": "no-op", "retry": "retry-once"}
ATTEMPTS: Final = {"noop": 1, "retry": 2}


@dataclass(frozen=True)
class Scenario:
    key: str
    short: str
    label: str
    database: str | None  # MIRROR_DATABASE, RESULTS_DATABASE, "sqlite" or None
    events: bool = False
    mirror: bool = False
    backend: str | None = None  # "db" or "redis"


SCENARIOS: Final = (
    Scenario("plain", "a", "(a) plain", None),
    Scenario("plain_events", "a+e", "(a+e) plain, events", None, events=True),
    Scenario("dbbackend", "b", "(b) SQLAlchemy backend", RESULTS_DATABASE, backend="db"),
    Scenario("pikku", "c", "(c) mirror, PostgreSQL", MIRROR_DATABASE, mirror=True),
    Scenario("pikku_events", "c+e", "(c+e) mirror, PG, events", MIRROR_DATABASE, True, True),
    Scenario("redisbackend", "d", "(d) Redis backend", None, backend="redis"),
    Scenario("pikku_sqlite", "s", "(s) mirror, SQLite", "sqlite", mirror=True),
)
BY_KEY: Final = {scenario.key: scenario for scenario in SCENARIOS}
# The prefork matrix: every scenario but the SQLite one, both variants.
MATRIX: Final = tuple(scenario for scenario in SCENARIOS if scenario.key != "pikku_sqlite")


def task_name(scenario: str, variant: str) -> str:
    return f"bench.{scenario}.{variant}"


def done_key(run: str) -> str:
    return f"{run}:done"


def warm_key(run: str) -> str:
    return f"{run}:warm"


def _count_done(sender: Any = None, args: Any = None, state: str | None = None, **_: Any) -> None:
    """The worker's count of finished tasks; the last one stamps the finishing time."""
    if state != "SUCCESS" or not str(getattr(sender, "name", "")).startswith("bench."):
        return
    run, total = args
    client = redis_client(sender.app.conf.broker_url)
    if client.incr(run) == total:
        client.rpush(done_key(run), repr(time.time()))


@dataclass
class BenchApp:
    app: Celery
    pikku: PikkuCelery | None
    #: Whether PikkuCelery had switched the task events on (the bench sets them per scenario).
    forced_events: bool
    recorder: StatsRecorder | None


def build_app(
    scenario_key: str,
    broker_url: str,
    database_url: str | None,
    stats_dir: Path | None = None,
    local_dir: Path | None = None,
) -> BenchApp:
    """The scenario's app with its two tasks: ``bench.<scenario>.noop`` and ``.retry``."""
    if scenario_key not in BY_KEY:
        raise SystemExit(f"unknown scenario {scenario_key!r}; one of {', '.join(BY_KEY)}")
    scenario = BY_KEY[scenario_key]
    if scenario.database is not None and not database_url:
        raise SystemExit(f"scenario {scenario_key!r} needs ${DATABASE_ENV}")
    backend = {"db": f"db+{database_url}", "redis": broker_url}.get(scenario.backend or "")
    app = Celery(f"bench_{scenario_key}", broker=broker_url, backend=backend)
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    if scenario.backend is not None:
        app.conf.update(task_track_started=True, result_extended=True)
    if local_dir is not None:
        # Where the mirror keeps its local files (spool or journal), whatever it calls them.
        app.conf.update(pikku_spool_dir=str(local_dir), pikku_journal_dir=str(local_dir))
    recorder = StatsRecorder(stats_dir) if scenario.mirror and stats_dir is not None else None
    if recorder is not None:
        recorder.install_mark()
    pikku = PikkuCelery(app, database_url=database_url) if scenario.mirror else None
    forced = pikku is not None and bool(app.conf.worker_send_task_events)
    app.conf.update(worker_send_task_events=scenario.events, task_send_sent_event=scenario.events)
    decorate: Callable[..., Callable[[Callable[..., Any]], Any]] = (
        pikku.step if pikku is not None else app.task
    )

    @decorate(name=task_name(scenario_key, "noop"))
    def noop(run: str, total: int) -> None:
        return None

    @decorate(name=task_name(scenario_key, "retry"), bind=True)
    def retry_once(self: Any, run: str, total: int) -> None:
        if self.request.retries == 0:
            raise self.retry(countdown=0)

    signals.task_postrun.connect(_count_done, weak=False, dispatch_uid="bench.count_done")
    if recorder is not None and pikku is not None:
        recorder.install_dumps(pikku)
    return BenchApp(app, pikku, forced, recorder)


def _app_from_env() -> BenchApp | None:
    scenario = os.environ.get(SCENARIO_ENV)
    if not scenario:
        return None
    stats_dir = os.environ.get(STATS_ENV)
    local_dir = os.environ.get(LOCAL_ENV)
    return build_app(
        scenario,
        os.environ.get(BROKER_ENV) or DEFAULT_REDIS_URL,
        os.environ.get(DATABASE_ENV),
        Path(stats_dir) if stats_dir else None,
        Path(local_dir) if local_dir else None,
    )


bench_app = _app_from_env()
#: What ``celery -A bench.throughput.app`` loads (None when no scenario is set).
app = bench_app.app if bench_app is not None else None
