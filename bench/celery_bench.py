"""Celery tasks per second with and without the pikku mirror, on real workers.

Run from the project root::

    python -m bench.celery_bench            # 2,000 tasks per run, best of 2, three pools
    python -m bench.celery_bench --quick    # 200 tasks, one round, prefork only

Every run starts its own ``celery worker`` on Redis (``-P prefork -c 2`` unless
said otherwise) and a separate publisher process, both built from the
scenario's environment, so no run carries another's signal handlers:

* (a) ``plain``: plain Celery tasks, no result backend, no task events;
* (a+e) ``plain_events``: (a) with ``worker_send_task_events`` and
  ``task_send_sent_event`` on;
* (b) ``dbbackend``: Celery's SQLAlchemy result backend on PostgreSQL
  (``task_track_started``, ``result_extended``);
* (c) ``pikku``: ``@pikku.step`` tasks mirrored into PostgreSQL, task events off;
* (c+e) ``pikku_events``: (c) with the two task-event settings on;
* (d) ``redisbackend``: Celery's Redis result backend (``task_track_started``,
  ``result_extended``);
* (s) ``pikku_sqlite``: the mirror's embedded default, a SQLite file.

Each with no-op tasks and with tasks that retry once; the threads and solo
pools run (a), (b) and (c) with no-op tasks. A task of (a), (b) or (d) counts as
done in ``task_postrun`` of its successful execution. A mirrored run counts as
done only when SQL shows every step ``succeeded``: once the worker has counted
its last task the publisher polls the mirror database, and the run ends at the
first poll that sees them all. Both processes warm up with a few tasks first.

For every run the bench reports CPU milliseconds per task by process
(publisher, worker main process, pool children, PostgreSQL, Redis), read from
``/proc``; for PostgreSQL scenarios the SQL commits per task (``xact_commit`` of
the scenario's database across the worker's life); and for mirrored runs what
the mirror says of its own delivery (``mirror.delivery_stats()``, when the
mirror has it): events appended and written, batches committed, and the lag
from each event to the commit of its batch, merged over the publisher and
every worker process.

This module is also the worker's app: ``celery -A bench.celery_bench worker``
builds the scenario named by ``BENCH_SCENARIO`` at import. The bench creates
and drops its own databases (``pikku_bench_mirror``, ``pikku_bench_results``)
and flushes its own Redis database before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import redis
import sqlalchemy as sa
from celery import Celery, signals
from sqlalchemy.engine import make_url

from bench.workers import stop_worker, wait_ready
from pikku_celery import PikkuCelery, WorkflowStore

SCENARIO_ENV: Final = "BENCH_SCENARIO"
BROKER_ENV: Final = "BENCH_BROKER_URL"
DATABASE_ENV: Final = "BENCH_DATABASE_URL"
STATS_ENV: Final = "BENCH_STATS_DIR"
LOCAL_ENV: Final = "BENCH_LOCAL_DIR"

DEFAULT_PG_URL: Final = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/13"
MIRROR_DATABASE: Final = "pikku_bench_mirror"
RESULTS_DATABASE: Final = "pikku_bench_results"
ROOT: Final = Path(__file__).resolve().parent.parent

WARMUP_TASKS: Final = 50
VARIANTS: Final = ("noop", "retry")
VARIANT_LABELS: Final = {"noop": "no-op", "retry": "retry-once"}
ATTEMPTS: Final = {"noop": 1, "retry": 2}
POOLS: Final = {
    "prefork": ("--pool=prefork", "-c", "2"),
    "threads": ("--pool=threads", "-c", "4"),
    "solo": ("--pool=solo",),
}
POOL_LABELS: Final = {"prefork": "prefork -c 2", "threads": "threads -c 4", "solo": "solo"}
# The scenarios the threads and solo pools run, no-op tasks only.
POOL_SCENARIOS: Final = ("plain", "dbbackend", "pikku")

TARGET_OF_PLAIN: Final = 0.8
AIM_OF_PLAIN: Final = 0.9
TARGET_OF_DBBACKEND: Final = 3.0
TARGET_LAG_P99: Final = 0.100
TARGET_COMMITS: Final = 0.3

# Slow enough to mean the worker is stuck rather than slow.
MIN_TASKS_PER_SECOND: Final = 5
SETTLE_TIMEOUT: Final = 60.0
SETTLE_POLL: Final = 0.005


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


def say(text: str = "") -> None:
    print(text, flush=True)


def task_name(scenario: str, variant: str) -> str:
    return f"bench.{scenario}.{variant}"


def done_key(run: str) -> str:
    return f"{run}:done"


def warm_key(run: str) -> str:
    return f"{run}:warm"


# --- the benchmark app (worker and publisher side) -----------------------------


_clients: dict[tuple[int, str], redis.Redis] = {}


def redis_client(url: str) -> redis.Redis:
    """One client per process: a forked worker child must not share its parent's socket."""
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(url)
    return client


def _count_done(sender: Any = None, args: Any = None, state: str | None = None, **_: Any) -> None:
    """The worker's count of finished tasks; the last one stamps the finishing time."""
    if state != "SUCCESS" or not str(getattr(sender, "name", "")).startswith("bench."):
        return
    run, total = args
    client = redis_client(sender.app.conf.broker_url)
    if client.incr(run) == total:
        client.rpush(done_key(run), repr(time.time()))


def delivery_snapshot(pikku: PikkuCelery) -> dict[str, Any] | None:
    """What the mirror of this process says of its delivery; None when it cannot say."""
    stats_of = getattr(pikku.mirror, "delivery_stats", None)
    if stats_of is None:
        return None
    stats = stats_of()
    return {
        "appended": int(stats.appended),
        "written": int(stats.written),
        "batches": int(stats.batches),
        "lags": [float(lag) for lag in stats.lags],
    }


class StatsRecorder:
    """Dumps this process's delivery stats when it ends, with a mark at the timed run's start.

    The mark is taken in ``task_prerun`` of the process's first task of the
    timed run (the warm-up's run keys end in ``:warm``), so the warm-up's
    events and the first connection stay out of the figures.
    """

    def __init__(self, folder: Path) -> None:
        self.pikku: PikkuCelery | None = None
        self.folder = folder
        self.marks: dict[int, dict[str, Any] | None] = {}

    def snapshot(self) -> dict[str, Any] | None:
        return delivery_snapshot(self.pikku) if self.pikku is not None else None

    def mark(self) -> None:
        if os.getpid() not in self.marks:
            self.marks[os.getpid()] = self.snapshot()

    def on_prerun(self, sender: Any = None, args: Any = None, **_: Any) -> None:
        if os.getpid() in self.marks or not str(getattr(sender, "name", "")).startswith("bench."):
            return
        if args and not str(args[0]).endswith(":warm"):
            self.mark()

    def dump(self, role: str) -> None:
        pid = os.getpid()
        record = {
            "role": role,
            "pid": pid,
            "total": self.snapshot(),
            "mark": self.marks.get(pid),
            "marked": pid in self.marks,
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{role}-{pid}.json").write_text(json.dumps(record))

    def install_mark(self) -> None:
        """Connected before PikkuCelery's handlers: the mark precedes the task's first event."""
        signals.task_prerun.connect(self.on_prerun, weak=False, dispatch_uid="bench.mark")

    def install_dumps(self, pikku: PikkuCelery) -> None:
        """Connected after PikkuCelery's handlers, so these run after the mirror's own."""
        self.pikku = pikku

        def child(**_: Any) -> None:
            self.dump("child")

        def main(**_: Any) -> None:
            self.dump("main")

        signals.worker_process_shutdown.connect(child, weak=False, dispatch_uid="bench.child")
        signals.worker_shutdown.connect(main, weak=False, dispatch_uid="bench.main")


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
#: What ``celery -A bench.celery_bench`` loads (None when no scenario is set).
app = bench_app.app if bench_app is not None else None


# --- CPU accounting -------------------------------------------------------------

COMPONENTS: Final = ("publisher", "worker main", "worker children", "postgres", "redis", "other")
COMPONENT_SHORT: Final = {
    "publisher": "pub",
    "worker main": "wmain",
    "worker children": "wkids",
    "postgres": "pg",
    "redis": "redis",
    "other": "other",
}


# A client backend's title: "postgres: [cluster: ]user database host(port) activity".
_BACKEND_TITLE: Final = re.compile(r"^postgres: (?:\S+: )?\S+ (\S+) (?:\S+\(\d+\)|\[local\])")


def _proc_stats() -> Iterator[tuple[int, str, int, int]]:
    """(pid, command, parent pid, user + system clock ticks) of every process."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone since the listing
        command = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 2 :].split()
        yield int(entry.name), command, int(rest[1]), int(rest[11]) + int(rest[12])


def _serves_other_database(pid: int) -> bool:
    """A client backend of a database that is not the bench's (another user's load)."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, UnicodeDecodeError):
        return False
    match = _BACKEND_TITLE.match(title)
    return match is not None and match.group(1) not in (MIRROR_DATABASE, RESULTS_DATABASE)


def cpu_snapshot(worker_pid: int) -> dict[str, float]:
    """CPU seconds used so far, by component; empty where there is no /proc.

    PostgreSQL is the bench databases' backends plus the server's own
    processes (WAL writer, checkpointer...); other databases' backends are
    left to "other".
    """
    if not Path("/proc/stat").exists():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    used: Counter[str] = Counter()
    for pid, command, parent, ticks in _proc_stats():
        if pid == worker_pid:
            used["worker main"] += ticks
        elif parent == worker_pid:
            used["worker children"] += ticks
        elif command == "postgres" and not _serves_other_database(pid):
            used["postgres"] += ticks
        elif command == "redis-server":
            used["redis"] += ticks
    times = os.times()
    snapshot = {name: value / tick for name, value in used.items()}
    snapshot["publisher"] = times.user + times.system
    jiffies = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = jiffies[3] + jiffies[4]
    snapshot["machine busy"] = (sum(jiffies[:8]) - idle) / tick
    snapshot["machine total"] = sum(jiffies[:8]) / tick
    return snapshot


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    if delta:
        known = sum(delta.get(name, 0.0) for name in COMPONENTS if name != "other")
        delta["other"] = max(0.0, delta["machine busy"] - known)
    return delta


# --- the publisher process ------------------------------------------------------


def wait_done(client: redis.Redis, run: str, total: int, timeout: float) -> float:
    """The worker's time of finishing the run's last task."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Short blocking calls: the client's socket timeout is shorter than a slow run.
        answer: Any = client.blpop([done_key(run)], timeout=1)
        if answer is not None:
            return float(answer[1])
    count = client.get(run)
    raise SystemExit(
        f"{run}: {int(count or 0)}/{total} tasks done after {timeout:.0f} s; see the worker's log"
    )


def _args0(column: str, dialect: str) -> str:
    """SQL for the first task argument (the run key) stored in a JSON column."""
    if dialect == "sqlite":
        return f"json_extract({column}, '$.args[0]')"
    return f"{column} -> 'args' ->> 0"


def settled_steps(engine: sa.Engine, run: str) -> int:
    """The run's steps SQL shows as succeeded.

    Read in a transaction that is rolled back, so the poll adds nothing to the
    database's ``xact_commit``.
    """
    where = _args0("data", engine.dialect.name)
    with engine.connect() as conn:
        count = conn.execute(
            sa.text(
                f"SELECT count(*) FROM workflow_step WHERE status = 'succeeded' AND {where} = :r"
            ),
            {"r": run},
        ).scalar_one()
    return int(count)


def wait_settled(engine: sa.Engine, run: str, total: int) -> float:
    """The first time SQL shows every step of the run succeeded."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    count = 0
    while time.monotonic() < deadline:
        count = settled_steps(engine, run)
        if count >= total:
            return time.time()
        time.sleep(SETTLE_POLL)
    raise SystemExit(f"{run}: SQL shows {count}/{total} steps succeeded {SETTLE_TIMEOUT:.0f} s on")


def wait_written(bench: BenchApp, timeout: float = 10.0) -> None:
    """Until this process's mirror has written every event it appended (when it can say)."""
    if bench.pikku is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = delivery_snapshot(bench.pikku)
        if snapshot is None or snapshot["written"] >= snapshot["appended"]:
            return
        time.sleep(0.01)


def publish(args: argparse.Namespace) -> int:
    """One timed run: warm up, publish ``--tasks`` tasks, wait until they are done."""
    if bench_app is None:
        raise SystemExit(f"the publisher needs ${SCENARIO_ENV}")
    scenario = BY_KEY[os.environ[SCENARIO_ENV]]
    task = bench_app.app.tasks[task_name(scenario.key, args.variant)]
    client = redis_client(bench_app.app.conf.broker_url)
    timeout = 60 + args.tasks * ATTEMPTS[args.variant] / MIN_TASKS_PER_SECOND
    mirror_db = None
    if scenario.mirror:
        mirror_db = sa.create_engine(os.environ[DATABASE_ENV], pool_size=1)
    try:
        warm = warm_key(args.run)
        for _ in range(WARMUP_TASKS):
            task.apply_async((warm, WARMUP_TASKS))
        wait_done(client, warm, WARMUP_TASKS, timeout)
        if mirror_db is not None:
            wait_settled(mirror_db, warm, WARMUP_TASKS)

        if bench_app.recorder is not None:
            bench_app.recorder.mark()
        before = cpu_snapshot(args.worker_pid)
        started = time.time()
        clock = time.perf_counter()
        for _ in range(args.tasks):
            task.apply_async((args.run, args.tasks))
        published = time.perf_counter() - clock
        worker_done = wait_done(client, args.run, args.tasks, timeout)
        finished = worker_done
        if mirror_db is not None:
            finished = max(worker_done, wait_settled(mirror_db, args.run, args.tasks))
        after = cpu_snapshot(args.worker_pid)
    finally:
        if mirror_db is not None:
            mirror_db.dispose()
    wait_written(bench_app)
    if bench_app.recorder is not None:
        bench_app.recorder.dump("publisher")
    report = {
        "elapsed": finished - started,
        "worker_elapsed": worker_done - started,
        "publish": published,
        "cpu": cpu_delta(before, after),
        "forced_events": bench_app.forced_events,
    }
    print(json.dumps(report), flush=True)
    return 0


# --- the driver: databases ---------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    tasks: int
    rounds: int
    pools: tuple[str, ...]
    pg_url: str
    redis_url: str


class Databases:
    """The bench's own databases on the PostgreSQL server, dropped at the end."""

    def __init__(self, admin_url: str) -> None:
        parsed = make_url(admin_url)
        if parsed.get_backend_name() not in ("postgresql", "postgres"):
            raise SystemExit(f"--pg-url must be a postgresql:// URL, not {parsed.drivername}://")
        if parsed.database in (MIRROR_DATABASE, RESULTS_DATABASE):
            raise SystemExit(
                f"--pg-url names {parsed.database!r}, a database the bench drops; "
                "point it at another database on the same server."
            )
        self._url = parsed.set(drivername="postgresql+psycopg")
        self._admin = sa.create_engine(self._url, isolation_level="AUTOCOMMIT")

    def url(self, name: str) -> str:
        return self._url.set(database=name).render_as_string(hide_password=False)

    def create(self) -> None:
        with self._admin.connect() as conn:
            for name in (MIRROR_DATABASE, RESULTS_DATABASE):
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                conn.exec_driver_sql(f"CREATE DATABASE {name}")

    def drop(self) -> None:
        with self._admin.connect() as conn:
            for name in (MIRROR_DATABASE, RESULTS_DATABASE):
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        self._admin.dispose()

    def commits(self, name: str, timeout: float = 20.0) -> int:
        """``xact_commit`` of database ``name`` once every backend on it is gone and flushed.

        Backends report their statistics lazily (at most once a second, and
        maybe ten seconds late when idle) but always as they exit, after they
        leave ``pg_stat_activity``: wait for none to be left, then for two
        equal readings in a row. Read from the admin database, so the reading
        commits nothing in ``name``.
        """
        deadline = time.monotonic() + timeout
        last: int | None = None
        with self._admin.connect() as conn:
            while time.monotonic() < deadline:
                left = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = :d AND backend_type = 'client backend'"
                    ),
                    {"d": name},
                ).scalar_one()
                if left:
                    time.sleep(0.05)
                    continue
                conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
                value = int(
                    conn.execute(
                        sa.text("SELECT xact_commit FROM pg_stat_database WHERE datname = :d"),
                        {"d": name},
                    ).scalar_one()
                )
                if value == last:
                    return value
                last = value
                time.sleep(0.3)
        raise SystemExit(f"{name}: its backends did not go away within {timeout:.0f} s")


def clear_mirror(url: str) -> None:
    """Empty the mirror's tables, so each run's polls scan only its own rows."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            names = set(sa.inspect(conn).get_table_names())
            tables = [
                name
                for name in ("workflow_step_history", "workflow_step", "workflow_runs")
                if name in names
            ]
            if tables:
                conn.exec_driver_sql(f"TRUNCATE {', '.join(tables)} CASCADE")
    finally:
        engine.dispose()


# --- the driver: one run --------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """The mirror's own account of one timed run, summed over its processes."""

    available: bool
    processes: int
    appended: int = 0
    written: int = 0
    batches: int = 0
    lags: tuple[float, ...] = ()

    def lag(self, q: float) -> float | None:
        if not self.lags:
            return None
        ordered = sorted(self.lags)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load_delivery(folder: Path) -> Delivery:
    records = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
    if not records or any(record["total"] is None for record in records):
        return Delivery(False, len(records))
    appended = written = batches = 0
    lags: list[float] = []
    for record in records:
        total, mark = record["total"], record["mark"]
        if mark is None:  # this process ran no task of the timed run (a prefork main process)
            mark = {"appended": 0, "written": 0, "batches": 0, "lags": []}
        appended += total["appended"] - mark["appended"]
        written += total["written"] - mark["written"]
        batches += total["batches"] - mark["batches"]
        # The lags of the events written since the mark: the newest ones (the mirror may
        # keep only its latest lags, so count from the end).
        since = min(total["written"] - mark["written"], len(total["lags"]))
        lags.extend(total["lags"][len(total["lags"]) - since :] if since > 0 else [])
    return Delivery(True, len(records), appended, written, batches, tuple(lags))


@dataclass(frozen=True)
class Run:
    scenario: str
    variant: str
    pool: str
    tasks: int
    elapsed: float
    worker_elapsed: float
    publish: float
    cpu: dict[str, float]
    #: SQL commits in the scenario's PostgreSQL database over the worker's life.
    commits: int | None = None
    delivery: Delivery | None = None
    check: str | None = None

    @property
    def rate(self) -> float:
        return self.tasks / self.elapsed

    @property
    def settle(self) -> float:
        """How long after the worker's last task SQL showed every step succeeded."""
        return self.elapsed - self.worker_elapsed

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds per task the bench's own processes spent (not "other")."""
        own = sum(self.cpu.get(name, 0.0) for name in COMPONENTS if name != "other")
        return own / self.tasks * 1000

    @property
    def ceiling(self) -> float:
        """Tasks per second with every CPU busy on this work alone: robust to outside load."""
        return (os.cpu_count() or 1) * 1000 / self.cpu_ms if self.cpu_ms else 0.0

    @property
    def commits_per_task(self) -> float | None:
        # The worker also ran the warm-up tasks.
        return None if self.commits is None else self.commits / (self.tasks + WARMUP_TASKS)

    @property
    def batches_per_task(self) -> float | None:
        if self.delivery is None or not self.delivery.available:
            return None
        return self.delivery.batches / self.tasks


@dataclass
class Bench:
    """What a run needs from the driver."""

    settings: Settings
    databases: Databases
    tmp: Path
    problems: list[str]
    notes: set[str]
    count: int = 0

    def scenario_env(
        self, scenario: Scenario, database_url: str | None, stats_dir: Path
    ) -> dict[str, str]:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("BENCH_", "PIKKU_"))
        }
        local = self.tmp / "local"
        env[SCENARIO_ENV] = scenario.key
        env[BROKER_ENV] = self.settings.redis_url
        env[STATS_ENV] = str(stats_dir)
        env[LOCAL_ENV] = str(local)
        env["PIKKU_SPOOL_DIR"] = env["PIKKU_JOURNAL_DIR"] = str(local)
        if database_url is not None:
            env[DATABASE_ENV] = database_url
        return env

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
        self.count += 1
        redis.Redis.from_url(self.settings.redis_url).flushdb()
        database_url = self.database_url(scenario)
        stats_dir = self.tmp / f"stats-{self.count}"
        env = self.scenario_env(scenario, database_url, stats_dir)
        log = self.tmp / f"worker-{self.count}-{scenario.key}-{variant}-{pool}.log"
        run_key = f"bench:{scenario.key}:{variant}:{pool}:{round_no}"
        pg_database = scenario.database if scenario.database not in (None, "sqlite") else None
        before = self.databases.commits(pg_database) if pg_database else None
        with running_worker(scenario, pool, env, log) as worker:
            report = publisher(variant, self.settings.tasks, run_key, worker.pid, env)
            check = None
            if scenario.mirror:
                assert database_url is not None
                mirror_check = check_mirror(database_url, run_key, self.settings.tasks, variant)
                check = mirror_check.describe()
                if not mirror_check.ok:
                    self.problems.append(f"{run_key}: {check}")
        commits = None
        if pg_database is not None and before is not None:
            commits = self.databases.commits(pg_database) - before
        delivery = load_delivery(stats_dir) if scenario.mirror else None
        failures = mirror_failures(log)
        if failures:
            self.problems.append(
                f"{run_key}: the worker logged {len(failures)} mirror failures, "
                f"the first: {failures[0]}"
            )
        if report.get("forced_events") and not scenario.events:
            self.notes.add(
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
        line = (
            f"[{progress}] round {round_no + 1}  {POOL_LABELS[pool]:<12} {scenario.label:<24} "
            f"{VARIANT_LABELS[variant]:<10} {run.rate:8.1f} tasks/s"
        )
        if run.commits_per_task is not None:
            line += f"  {run.commits_per_task:.2f} commits/task"
        if delivery is not None:
            p99 = delivery.lag(0.99)
            line += f"  settle {run.settle * 1000:.0f} ms, lag p99 " + (
                f"{p99 * 1000:.1f} ms" if p99 is not None else "n/a"
            )
        if check is not None:
            line += f"  mirror: {check}"
        say(line)
        return run


@contextmanager
def running_worker(
    scenario: Scenario, pool: str, env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A real worker for the scenario, answering a ping; stopped warmly afterwards."""
    command = [
        sys.executable, "-m", "celery", "-A", "bench.celery_bench", "worker", *POOLS[pool],
        "-l", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"bench-{scenario.key}@%h",
    ]  # fmt: skip
    with log.open("ab") as output:
        worker = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_ready(worker, env[BROKER_ENV], log)
        yield worker
    finally:
        stop_worker(worker)


def publisher(
    variant: str, tasks: int, run: str, worker_pid: int, env: dict[str, str]
) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "bench.celery_bench", "--role", "publish",
        "--variant", variant, "--tasks", str(tasks), "--run", run,
        "--worker-pid", str(worker_pid),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the publisher failed:\n{done.stdout}{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@dataclass
class MirrorCheck:
    steps: int
    succeeded: int
    attempts: Counter[str]
    runs_completed: int
    expected: int
    attempts_per_step: int

    @property
    def ok(self) -> bool:
        rows = sum(self.attempts.values())
        failed_ok = self.attempts["failed"] == self.expected * (self.attempts_per_step - 1)
        return (
            self.steps == self.succeeded == self.runs_completed == self.expected
            and self.attempts["succeeded"] == self.expected
            and rows == self.expected * self.attempts_per_step
            and failed_ok
        )

    def describe(self) -> str:
        rows = sum(self.attempts.values())
        by_status = ", ".join(
            f"{count} {status}" for status, count in sorted(self.attempts.items())
        )
        return (
            f"{self.succeeded}/{self.expected} steps, {rows} attempts ({by_status}), "
            f"{self.runs_completed} runs: {'ok' if self.ok else 'MISMATCH'}"
        )


def check_mirror(url: str, run: str, tasks: int, variant: str) -> MirrorCheck:
    """What the mirror recorded for one run's tasks (their first argument is the run key)."""
    engine = sa.create_engine(url)
    dialect = engine.dialect.name
    params = {"run": run}
    try:
        with engine.connect() as conn:
            steps, succeeded = conn.execute(
                sa.text(
                    "SELECT count(*), coalesce(sum(CASE WHEN status = 'succeeded' THEN 1 END), 0) "
                    f"FROM workflow_step WHERE {_args0('data', dialect)} = :run"
                ),
                params,
            ).one()
            attempts = conn.execute(
                sa.text(
                    "SELECT h.status, count(*) FROM workflow_step_history h "
                    "JOIN workflow_step s ON s.workflow_step_id = h.workflow_step_id "
                    f"WHERE {_args0('s.data', dialect)} = :run GROUP BY h.status"
                ),
                params,
            ).all()
            runs_completed = conn.execute(
                sa.text(
                    "SELECT count(*) FROM workflow_runs "
                    f"WHERE {_args0('input', dialect)} = :run AND status = 'completed'"
                ),
                params,
            ).scalar_one()
    finally:
        engine.dispose()
    return MirrorCheck(
        steps=steps,
        succeeded=succeeded,
        attempts=Counter({status: count for status, count in attempts}),
        runs_completed=runs_completed,
        expected=tasks,
        attempts_per_step=ATTEMPTS[variant],
    )


def mirror_failures(log: Path) -> list[str]:
    """The worker log's lines saying a mirror write or a signal handler failed."""
    text = log.read_text(errors="replace") if log.exists() else ""
    markers = ("pikku-celery could not record", "pikku-celery signal handler")
    return [line for line in text.splitlines() if any(marker in line for marker in markers)]


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
        for scenario, variant, pool in plan if round_no % 2 == 0 else plan[::-1]:
            runs.append(bench.run(scenario, variant, pool, round_no, f"{len(runs) + 1}/{total}"))
    return runs


# --- the report -----------------------------------------------------------------


def best(runs: Sequence[Run], scenario: str, variant: str, pool: str = "prefork") -> Run | None:
    matching = [
        run
        for run in runs
        if run.scenario == scenario and run.variant == variant and run.pool == pool
    ]
    return max(matching, key=lambda run: run.rate) if matching else None


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * width for width in widths], *rows]:
        say("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def ratio(top: Run | None, bottom: Run | None, measure: Callable[[Run], float]) -> float | None:
    if top is None or bottom is None or not measure(bottom):
        return None
    return measure(top) / measure(bottom)


def fmt(value: float | None, spec: str = ".2f", scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, spec)


def verdict(value: float | None, target: float, *, at_most: bool = False) -> str:
    if value is None:
        return "n/a"
    return "met" if (value <= target if at_most else value >= target) else "MISSED"


def rate_of(run: Run) -> float:
    return run.rate


def ceiling_of(run: Run) -> float:
    return run.ceiling


def report_runs(runs: Sequence[Run], settings: Settings) -> None:
    say()
    say(
        f"Tasks per second, {settings.tasks:,} tasks per run, best of {settings.rounds}, "
        f"{os.cpu_count()} CPUs; CPU ms per task of the best run by process"
    )
    rows: list[list[str]] = []
    for pool in POOLS:
        for scenario in SCENARIOS:
            for variant in VARIANTS:
                top = best(runs, scenario.key, variant, pool)
                if top is None:
                    continue
                every = [
                    f"{run.rate:.0f}"
                    for run in runs
                    if (run.scenario, run.variant, run.pool) == (scenario.key, variant, pool)
                ]
                cpu = [f"{top.cpu.get(name, 0.0) / top.tasks * 1000:.2f}" for name in COMPONENTS]
                rows.append(
                    [
                        pool,
                        scenario.label,
                        VARIANT_LABELS[variant],
                        f"{top.rate:.1f}",
                        "/".join(every),
                        *cpu,
                        f"{top.cpu_ms:.2f}",
                        f"{top.ceiling:.0f}",
                        fmt(top.commits_per_task),
                    ]
                )
    header = [
        "pool", "scenario", "variant", "tasks/s", "rounds",
        *(f"{COMPONENT_SHORT[name]} ms" for name in COMPONENTS),
        "bench ms", "CPU-bound/s", "commits/task",
    ]  # fmt: skip
    table(header, rows)
    say(
        "(pub = publisher, wmain/wkids = worker main process/pool children, other = CPU "
        "spent outside the bench; 'bench ms' sums the bench's own processes and "
        "'CPU-bound/s' is what that cost allows with every CPU on it; commits/task is "
        "xact_commit of the scenario's database over the worker's life, warm-up included)"
    )


def report_ratios(runs: Sequence[Run]) -> list[str]:
    """The ratio table; returns the targets missed."""
    say()
    say(
        f"Ratios, prefork: c/a >= {TARGET_OF_PLAIN} (aim {AIM_OF_PLAIN}), the same with "
        f"task events on for both, c/b >= {TARGET_OF_DBBACKEND:g}; c/d reported"
    )
    missed: list[str] = []
    rows = []
    for variant in VARIANTS:
        got = {scenario.short: best(runs, scenario.key, variant) for scenario in SCENARIOS}
        of_plain = ratio(got["c"], got["a"], rate_of)
        with_events = ratio(got["c+e"], got["a+e"], rate_of)
        of_db = ratio(got["c"], got["b"], rate_of)
        of_redis = ratio(got["c"], got["d"], rate_of)
        for name, value, target in (
            ("c/a", of_plain, TARGET_OF_PLAIN),
            ("(c+e)/(a+e)", with_events, TARGET_OF_PLAIN),
            ("c/b", of_db, TARGET_OF_DBBACKEND),
        ):
            if verdict(value, target) == "MISSED":
                missed.append(f"{VARIANT_LABELS[variant]} {name} {value:.2f} < {target:g}")
        rows.append(
            [
                VARIANT_LABELS[variant],
                fmt(of_plain),
                verdict(of_plain, TARGET_OF_PLAIN),
                fmt(with_events),
                verdict(with_events, TARGET_OF_PLAIN),
                fmt(of_db),
                verdict(of_db, TARGET_OF_DBBACKEND),
                fmt(of_redis),
                fmt(ratio(got["c"], got["a"], ceiling_of)),
                fmt(ratio(got["c"], got["b"], ceiling_of)),
                fmt(ratio(got["s"], got["a"], rate_of)),
            ]
        )
    table(
        [
            "variant", "c/a", f">= {TARGET_OF_PLAIN}", "(c+e)/(a+e)", f">= {TARGET_OF_PLAIN}",
            "c/b", f">= {TARGET_OF_DBBACKEND:g}", "c/d", "c/a by CPU", "c/b by CPU", "s/a",
        ],
        rows,
    )  # fmt: skip
    return missed


def report_delivery(runs: Sequence[Run]) -> list[str]:
    """The mirror's lag and commits per task; returns the targets missed."""
    say()
    say(
        f"Mirror delivery of the best runs: lag from event to the COMMIT of its batch "
        f"(p99 <= {TARGET_LAG_P99 * 1000:.0f} ms), SQL commits per task (<= {TARGET_COMMITS})"
    )
    missed: list[str] = []
    rows = []
    for pool in POOLS:
        for scenario in SCENARIOS:
            if not scenario.mirror:
                continue
            for variant in VARIANTS:
                top = best(runs, scenario.key, variant, pool)
                if top is None or top.delivery is None:
                    continue
                d = top.delivery
                p99 = d.lag(0.99)
                commits = top.commits_per_task
                label = f"{pool} {scenario.short} {VARIANT_LABELS[variant]}"
                if verdict(p99, TARGET_LAG_P99, at_most=True) == "MISSED" and p99 is not None:
                    missed.append(
                        f"{label}: lag p99 {p99 * 1000:.1f} ms > {TARGET_LAG_P99 * 1000:.0f} ms"
                    )
                if verdict(commits, TARGET_COMMITS, at_most=True) == "MISSED":
                    missed.append(f"{label}: {commits:.3f} commits/task > {TARGET_COMMITS}")
                rows.append(
                    [
                        pool,
                        scenario.label,
                        VARIANT_LABELS[variant],
                        f"{top.settle * 1000:.0f}",
                        fmt(d.lag(0.5), ".1f", 1000),
                        fmt(p99, ".1f", 1000),
                        fmt(max(d.lags) if d.lags else None, ".1f", 1000),
                        verdict(p99, TARGET_LAG_P99, at_most=True),
                        str(d.processes),
                        f"{d.appended}/{d.written}" if d.available else "n/a",
                        fmt(top.batches_per_task, ".3f"),
                        fmt(commits, ".3f"),
                        verdict(commits, TARGET_COMMITS, at_most=True),
                    ]
                )
    table(
        [
            "pool", "scenario", "variant", "settle ms", "lag p50 ms", "lag p99 ms",
            "lag max ms", "p99", "procs", "appended/written", "batches/task",
            "commits/task", "commits",
        ],
        rows,
    )  # fmt: skip
    say(
        "(settle = SQL showing every step succeeded, minus the worker counting its last "
        "task; lags and batches are the timed run's, summed over the publisher and every "
        "worker process; n/a = the mirror has no delivery_stats())"
    )
    return missed


def report_pools(runs: Sequence[Run], settings: Settings) -> None:
    if len(settings.pools) < 2:
        return
    say()
    say("No-op tasks by pool: tasks/s (best), c/a and c/b")
    rows = []
    for pool in settings.pools:
        plain, dbbackend, pikku = (best(runs, key, "noop", pool) for key in POOL_SCENARIOS)
        rows.append(
            [
                POOL_LABELS[pool],
                *(fmt(run.rate if run else None, ".1f") for run in (plain, dbbackend, pikku)),
                fmt(ratio(pikku, plain, rate_of)),
                verdict(ratio(pikku, plain, rate_of), TARGET_OF_PLAIN),
                fmt(ratio(pikku, dbbackend, rate_of)),
                verdict(ratio(pikku, dbbackend, rate_of), TARGET_OF_DBBACKEND),
                fmt(pikku.cpu_ms if pikku else None),
            ]
        )
    table(
        [
            "pool", "(a)/s", "(b)/s", "(c)/s", "c/a", f">= {TARGET_OF_PLAIN}",
            "c/b", f">= {TARGET_OF_DBBACKEND:g}", "(c) bench ms",
        ],
        rows,
    )  # fmt: skip


def parse_pools(text: str) -> tuple[str, ...]:
    pools = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in pools if name not in POOLS]
    if unknown or not pools:
        raise argparse.ArgumentTypeError(f"pools are some of {', '.join(POOLS)}")
    return pools


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.celery_bench",
        description="Celery tasks per second on real workers: plain, with Celery's database "
        "and Redis result backends, and with the pikku mirror; the mirror's lag and commits.",
    )
    parser.add_argument("--tasks", type=int, help="tasks per run (default 2000, --quick 200)")
    parser.add_argument(
        "--rounds", type=int, help="rounds; the best is kept (default 2, --quick 1)"
    )
    parser.add_argument(
        "--pools",
        type=parse_pools,
        help="worker pools, some of prefork,threads,solo (default all three, --quick prefork); "
        "prefork runs every scenario, threads and solo (a), (b), (c) with no-op tasks",
    )
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG_URL,
        help=f"an existing PostgreSQL database to connect to (default {DEFAULT_PG_URL}); "
        f"the bench creates and drops {MIRROR_DATABASE!r} and {RESULTS_DATABASE!r} on its server",
    )
    parser.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS_URL,
        help=f"the broker and Redis result backend (default {DEFAULT_REDIS_URL}); "
        "this database is flushed",
    )
    parser.add_argument("--quick", action="store_true", help="200 tasks, one round, prefork")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed, too")
    # The publisher process the driver starts for every run.
    parser.add_argument(
        "--role", choices=("driver", "publish"), default="driver", help=argparse.SUPPRESS
    )
    parser.add_argument("--variant", choices=VARIANTS, default="noop", help=argparse.SUPPRESS)
    parser.add_argument("--run", default="bench:run", help=argparse.SUPPRESS)
    parser.add_argument("--worker-pid", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "publish":
        return publish(args)
    settings = Settings(
        tasks=args.tasks or (200 if args.quick else 2000),
        rounds=args.rounds or (1 if args.quick else 2),
        pools=args.pools or (("prefork",) if args.quick else tuple(POOLS)),
        pg_url=args.pg_url,
        redis_url=args.redis_url,
    )
    if settings.tasks < 1 or settings.rounds < 1:
        raise SystemExit("--tasks and --rounds must be at least 1")
    started = time.perf_counter()
    databases = Databases(settings.pg_url)
    databases.create()
    problems: list[str] = []
    notes: set[str] = set()
    missed: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="celery-bench-"))
    try:
        store = WorkflowStore(databases.url(MIRROR_DATABASE))
        store.init()
        store.close()
        bench = Bench(settings, databases, tmp, problems, notes)
        runs = measure(bench)
        report_runs(runs, settings)
        if "prefork" in settings.pools:
            missed += report_ratios(runs)
        missed += report_delivery(runs)
        report_pools(runs, settings)
    finally:
        redis.Redis.from_url(settings.redis_url).flushdb()
        databases.drop()
        shutil.rmtree(tmp, ignore_errors=True)
    say()
    for note in sorted(notes):
        say(f"NOTE: {note}")
    for target in missed:
        say(f"TARGET MISSED: {target}")
    for problem in problems:
        say(f"MIRROR PROBLEM: {problem}")
    say(f"done in {time.perf_counter() - started:.0f} s")
    return 1 if problems or (args.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
