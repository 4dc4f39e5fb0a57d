"""Celery tasks per second with and without the pikku mirror, on a real prefork worker.

Run from the project root::

    python -m bench.celery_bench            # 2,000 tasks per run, best of 2 rounds
    python -m bench.celery_bench --quick    # 200 tasks, one round

Each scenario runs ``celery worker --pool=prefork -c 2`` on Redis:

* (a) ``plain``: plain Celery tasks, no result backend;
* (b) ``dbbackend``: plain tasks with Celery's SQLAlchemy result backend on
  PostgreSQL (``task_track_started``, ``result_extended``);
* (c) ``pikku``: ``@pikku.step`` tasks mirrored into PostgreSQL;
* (a') ``events``: plain tasks with the task events ``PikkuCelery`` switches
  on, a diagnostic that splits the gap between (a) and (c) into events and SQL.

Each with no-op tasks and with tasks that retry once. Tasks are published from
a separate process per run, built like the worker from the scenario's
environment, so no scenario carries another's signal handlers. A task counts
as done in ``task_postrun`` of its successful execution, after its result row
or mirror rows are written; a run lasts from its first publish until the
worker counts its last task. Both processes warm up with a few tasks first.

For every run the bench also reports CPU milliseconds per task by process
(publisher, worker main process, pool children, PostgreSQL, Redis), read from
``/proc``. When (c) misses a target (or with ``--profile always``) it looks
for where the time goes: each side alone (publishing with no worker running,
then a worker draining the full queue), the database's own round-trip and
commit latency, then SQL statements and transactions per task counted with
SQLAlchemy events and cProfile in the publisher and in every worker process.

This module is also the worker's app: ``celery -A bench.celery_bench worker``
builds the scenario named by ``BENCH_SCENARIO`` at import. The bench creates
and drops its own databases (``pikku_bench_mirror``, ``pikku_bench_results``)
and flushes its own Redis database before each scenario.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import redis
import sqlalchemy as sa
from celery import Celery, signals
from psycopg.pq import TransactionStatus
from sqlalchemy.engine import make_url

from bench.workers import stop_worker, wait_ready
from pikku_celery import PikkuCelery

SCENARIO_ENV: Final = "BENCH_SCENARIO"
BROKER_ENV: Final = "BENCH_BROKER_URL"
DATABASE_ENV: Final = "BENCH_DATABASE_URL"
PROFILE_ENV: Final = "BENCH_PROFILE_DIR"

DEFAULT_PG_URL: Final = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/13"
MIRROR_DATABASE: Final = "pikku_bench_mirror"
RESULTS_DATABASE: Final = "pikku_bench_results"
ROOT: Final = Path(__file__).resolve().parent.parent

CONCURRENCY: Final = 2
WARMUP_TASKS: Final = 50
# Enough that the driver is waiting before the worker gets through them.
DRAIN_WARMUP_TASKS: Final = 300
FLOOR_SAMPLES: Final = 500
PROFILE_TASKS: Final = 500
SPLIT_TASKS: Final = 1000
VARIANTS: Final = ("noop", "retry")
VARIANT_LABELS: Final = {"noop": "no-op", "retry": "retry-once"}
ATTEMPTS: Final = {"noop": 1, "retry": 2}
TARGET_OF_PLAIN: Final = 0.7
TARGET_OF_DBBACKEND: Final = 2.0
# Slow enough to mean the worker is stuck rather than slow.
MIN_TASKS_PER_SECOND: Final = 5
IDLE: Final = TransactionStatus.IDLE


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    database: str | None


SCENARIOS: Final = (
    Scenario("plain", "(a) plain, no result backend", None),
    Scenario("dbbackend", "(b) plain + DB result backend", RESULTS_DATABASE),
    Scenario("pikku", "(c) pikku mirror", MIRROR_DATABASE),
    Scenario("events", "(a') plain + task events", None),
)
BY_KEY: Final = {scenario.key: scenario for scenario in SCENARIOS}


def say(text: str = "") -> None:
    print(text, flush=True)


def task_name(scenario: str, variant: str) -> str:
    return f"bench.{scenario}.{variant}"


def done_key(run: str) -> str:
    return f"{run}:done"


# --- the benchmark app (worker and publisher side) -----------------------------


_clients: dict[tuple[int, str], redis.Redis] = {}


def redis_client(url: str) -> redis.Redis:
    """One client per process: a forked worker child must not share its parent's socket."""
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(url)
    return client


class Probe:
    """Counts SQL statements and round trips, and runs cProfile, in one process.

    Round trips are counted at the driver: psycopg sends BEGIN by itself
    before the first statement of a transaction, and a statement on an
    autocommit connection needs neither BEGIN nor COMMIT.
    """

    def __init__(self) -> None:
        self.statements: Counter[str] = Counter()
        self.autocommit = 0
        self.begins = 0
        self.transactions = 0
        self.executions = 0
        self.tasks = 0
        self.profiler = cProfile.Profile()

    def start(self) -> None:
        sa.event.listen(sa.Engine, "before_cursor_execute", self._statement)
        sa.event.listen(sa.Engine, "commit", self._commit)
        self.profiler.enable()

    def stop(self) -> None:
        self.profiler.disable()
        sa.event.remove(sa.Engine, "before_cursor_execute", self._statement)
        sa.event.remove(sa.Engine, "commit", self._commit)

    def _statement(self, *args: Any) -> None:
        conn: sa.Connection = args[0]
        statement: str = args[2]
        self.statements[statement.split(None, 1)[0].upper()] += 1
        dbapi: Any = conn.connection.dbapi_connection
        if getattr(dbapi, "autocommit", False):
            self.autocommit += 1
        elif getattr(getattr(dbapi, "info", None), "transaction_status", None) == IDLE:
            self.begins += 1

    def _commit(self, conn: sa.Connection) -> None:
        if not getattr(conn.connection.dbapi_connection, "autocommit", False):
            self.transactions += 1

    def dump(self, stem: Path) -> None:
        self.profiler.dump_stats(stem.with_suffix(".prof"))
        summary = {
            "statements": dict(self.statements),
            "autocommit": self.autocommit,
            "begins": self.begins,
            "transactions": self.transactions,
            "executions": self.executions,
            "tasks": self.tasks,
        }
        stem.with_suffix(".json").write_text(json.dumps(summary))


# The probe of this process, when profiling: a worker child's or the main process's.
_probes: dict[int, Probe] = {}


def _count_done(sender: Any = None, args: Any = None, state: str | None = None, **_: Any) -> None:
    """The worker's count of finished tasks; the last one stamps the finishing time."""
    if state != "SUCCESS" or not str(getattr(sender, "name", "")).startswith("bench."):
        return
    run, total = args
    client = redis_client(sender.app.conf.broker_url)
    if client.incr(run) == total:
        client.rpush(done_key(run), repr(time.time()))
    probe = _probes.get(os.getpid())
    if probe is not None:
        probe.tasks += 1


def _count_execution(sender: Any = None, **_: Any) -> None:
    probe = _probes.get(os.getpid())
    if probe is not None and str(getattr(sender, "name", "")).startswith("bench."):
        probe.executions += 1


def _install_worker_probes(profile_dir: Path) -> None:
    def start(**_: Any) -> None:
        if os.getpid() not in _probes:
            _probes[os.getpid()] = probe = Probe()
            probe.start()

    def child_stop(**_: Any) -> None:
        probe = _probes.pop(os.getpid(), None)
        if probe is not None:
            probe.stop()
            probe.dump(profile_dir / f"child-{os.getpid()}")

    def main_stop(**_: Any) -> None:
        probe = _probes.pop(os.getpid(), None)
        if probe is not None:
            probe.stop()
            probe.dump(profile_dir / f"main-{os.getpid()}")

    # The main process starts profiling once its children are forked, so they
    # never inherit its profiler; each child profiles itself.
    for sig, handler, uid in (
        (signals.worker_process_init, start, "child_start"),
        (signals.worker_process_shutdown, child_stop, "child_stop"),
        (signals.worker_ready, start, "main_start"),
        (signals.worker_shutdown, main_stop, "main_stop"),
        (signals.task_prerun, _count_execution, "count_execution"),
    ):
        sig.connect(handler, weak=False, dispatch_uid=f"bench.{uid}")


def build_app(
    scenario: str, broker_url: str, database_url: str | None, profile_dir: Path | None = None
) -> tuple[Celery, PikkuCelery | None]:
    """The scenario's app with its two tasks: ``bench.<scenario>.noop`` and ``.retry``."""
    if scenario not in BY_KEY:
        raise SystemExit(f"unknown scenario {scenario!r}; one of {', '.join(BY_KEY)}")
    if BY_KEY[scenario].database is not None and not database_url:
        raise SystemExit(f"scenario {scenario!r} needs ${DATABASE_ENV}")
    backend = f"db+{database_url}" if scenario == "dbbackend" else None
    app = Celery(f"bench_{scenario}", broker=broker_url, backend=backend)
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    if scenario == "dbbackend":
        app.conf.update(task_track_started=True, result_extended=True)
    if scenario == "events":
        # Exactly what PikkuCelery switches on.
        app.conf.update(worker_send_task_events=True, task_send_sent_event=True)
    pikku = PikkuCelery(app, database_url=database_url) if scenario == "pikku" else None
    decorate: Callable[..., Callable[[Callable[..., Any]], Any]] = (
        pikku.step if pikku is not None else app.task
    )

    @decorate(name=task_name(scenario, "noop"))
    def noop(run: str, total: int) -> None:
        return None

    @decorate(name=task_name(scenario, "retry"), bind=True)
    def retry_once(self: Any, run: str, total: int) -> None:
        if self.request.retries == 0:
            raise self.retry(countdown=0)

    signals.task_postrun.connect(_count_done, weak=False, dispatch_uid="bench.count_done")
    if profile_dir is not None:
        _install_worker_probes(profile_dir)
    return app, pikku


def _app_from_env() -> Celery | None:
    scenario = os.environ.get(SCENARIO_ENV)
    if not scenario:
        return None
    profile_dir = os.environ.get(PROFILE_ENV)
    app, _ = build_app(
        scenario,
        os.environ.get(BROKER_ENV) or DEFAULT_REDIS_URL,
        os.environ.get(DATABASE_ENV),
        Path(profile_dir) if profile_dir else None,
    )
    return app


#: What ``celery -A bench.celery_bench`` loads (None when no scenario is set).
app = _app_from_env()


# --- CPU accounting -------------------------------------------------------------

COMPONENTS: Final = ("publisher", "worker main", "worker children", "postgres", "redis", "other")


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


def wait_done(
    client: redis.Redis,
    run: str,
    total: int,
    timeout: float,
    alive: Callable[[], bool] = lambda: True,
) -> float:
    """The worker's time of finishing the run's last task."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        # Short blocking calls: the client's socket timeout is shorter than a slow run.
        answer: Any = client.blpop([done_key(run)], timeout=1)
        if answer is not None:
            return float(answer[1])
    count = client.get(run)
    raise SystemExit(
        f"{run}: {int(count or 0)}/{total} tasks done after {timeout:.0f} s; see the worker's log"
    )


def enqueue(task: Any, warmup: Any, run: str, tasks: int) -> None:
    """Publish ahead of the worker: warm-up tasks, then the timed ones, nothing consumed yet."""
    for _ in range(DRAIN_WARMUP_TASKS):
        warmup.apply_async((f"{run}:warm", DRAIN_WARMUP_TASKS))
    clock = time.perf_counter()
    for _ in range(tasks):
        task.apply_async((run, tasks))
    print(json.dumps({"publish": time.perf_counter() - clock}), flush=True)


def publish(args: argparse.Namespace) -> int:
    """One timed run: warm up, publish ``--tasks`` tasks, wait for the last one."""
    if app is None:
        raise SystemExit(f"the publisher needs ${SCENARIO_ENV}")
    task = app.tasks[task_name(os.environ[SCENARIO_ENV], args.variant)]
    if args.mode == "enqueue":
        # A retry goes to the back of the queue: retrying warm-up tasks would
        # finish behind the timed tasks' first attempts.
        enqueue(task, app.tasks[task_name(os.environ[SCENARIO_ENV], "noop")], args.run, args.tasks)
        return 0
    client = redis_client(app.conf.broker_url)
    timeout = 60 + args.tasks * ATTEMPTS[args.variant] / MIN_TASKS_PER_SECOND
    warm = f"{args.run}:warm"
    for _ in range(WARMUP_TASKS):
        task.apply_async((warm, WARMUP_TASKS))
    wait_done(client, warm, WARMUP_TASKS, timeout)

    profile_dir = os.environ.get(PROFILE_ENV)
    probe = Probe() if profile_dir else None
    before = cpu_snapshot(args.worker_pid)
    if probe is not None:
        probe.start()
    started = time.time()
    clock = time.perf_counter()
    for _ in range(args.tasks):
        task.apply_async((args.run, args.tasks))
    published = time.perf_counter() - clock
    if probe is not None and profile_dir:
        probe.stop()
        probe.executions = probe.tasks = args.tasks
        probe.dump(Path(profile_dir) / "publisher")
    finished = wait_done(client, args.run, args.tasks, timeout)
    after = cpu_snapshot(args.worker_pid)
    report = {"elapsed": finished - started, "publish": published, "cpu": cpu_delta(before, after)}
    print(json.dumps(report), flush=True)
    return 0


# --- the driver -----------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    tasks: int
    rounds: int
    profile: str
    pg_url: str
    redis_url: str


@dataclass(frozen=True)
class Run:
    scenario: str
    variant: str
    tasks: int
    elapsed: float
    publish: float
    cpu: dict[str, float]

    @property
    def rate(self) -> float:
        return self.tasks / self.elapsed

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds per task the bench's own processes spent (not "other")."""
        own = sum(self.cpu.get(name, 0.0) for name in COMPONENTS if name != "other")
        return own / self.tasks * 1000

    @property
    def ceiling(self) -> float:
        """Tasks per second with every CPU busy on this work alone: robust to outside load."""
        return (os.cpu_count() or 1) * 1000 / self.cpu_ms if self.cpu_ms else 0.0


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
            f"{self.succeeded}/{self.expected} steps succeeded, {rows} attempt rows "
            f"({rows / max(self.steps, 1):.2f} per step: {by_status}), "
            f"{self.runs_completed} runs completed: {'ok' if self.ok else 'MISMATCH'}"
        )


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


def scenario_env(
    scenario: Scenario, settings: Settings, databases: Databases, profile_dir: Path | None
) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("BENCH_", "PIKKU_"))
    }
    env[SCENARIO_ENV] = scenario.key
    env[BROKER_ENV] = settings.redis_url
    if scenario.database is not None:
        env[DATABASE_ENV] = databases.url(scenario.database)
    if profile_dir is not None:
        env[PROFILE_ENV] = str(profile_dir)
    return env


@contextmanager
def running_worker(
    scenario: Scenario, env: dict[str, str], log: Path, *, ready: bool = True
) -> Iterator[subprocess.Popen[bytes]]:
    """A real prefork worker for the scenario, stopped warmly afterwards.

    With ``ready`` it has answered a ping first; without, it is still starting.
    """
    hostname = f"bench-{scenario.key}@%h"
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.celery_bench",
        "worker",
        "--pool=prefork",
        "-c",
        str(CONCURRENCY),
        "-l",
        "warning",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        hostname,
    ]
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
        if ready:
            wait_ready(worker, env[BROKER_ENV], log)
        yield worker
    finally:
        stop_worker(worker)


def publisher(
    mode: str, variant: str, tasks: int, run: str, worker_pid: int, env: dict[str, str]
) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "bench.celery_bench", "--role", "publish", "--mode", mode,
        "--variant", variant, "--tasks", str(tasks), "--run", run,
        "--worker-pid", str(worker_pid),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the publisher failed:\n{done.stdout}{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def publish_run(
    scenario: Scenario, variant: str, tasks: int, run: str, worker_pid: int, env: dict[str, str]
) -> Run:
    report = publisher("timed", variant, tasks, run, worker_pid, env)
    return Run(scenario.key, variant, tasks, report["elapsed"], report["publish"], report["cpu"])


def check_mirror(engine: sa.Engine, run: str, tasks: int, variant: str) -> MirrorCheck:
    """What the mirror recorded for one run's tasks (their first argument is the run key)."""
    params = {"run": run}
    with engine.connect() as conn:
        steps, succeeded = conn.execute(
            sa.text(
                "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded') "
                "FROM workflow_step WHERE data -> 'args' ->> 0 = :run"
            ),
            params,
        ).one()
        attempts = conn.execute(
            sa.text(
                "SELECT h.status, count(*) FROM workflow_step_history h "
                "JOIN workflow_step s ON s.workflow_step_id = h.workflow_step_id "
                "WHERE s.data -> 'args' ->> 0 = :run GROUP BY h.status"
            ),
            params,
        ).all()
        runs_completed = conn.execute(
            sa.text(
                "SELECT count(*) FROM workflow_runs "
                "WHERE input -> 'args' ->> 0 = :run AND status = 'completed'"
            ),
            params,
        ).scalar_one()
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


def measure(settings: Settings, databases: Databases, logs: Path) -> tuple[list[Run], list[str]]:
    """Every timed run, and what went wrong in the mirror (nothing, one hopes)."""
    mirror = sa.create_engine(databases.url(MIRROR_DATABASE))
    broker = redis.Redis.from_url(settings.redis_url)
    runs: list[Run] = []
    problems: list[str] = []
    try:
        for round_no in range(settings.rounds):
            # Alternating the order keeps a slow start or a warm cache off one scenario.
            order = SCENARIOS if round_no % 2 == 0 else SCENARIOS[::-1]
            for scenario in order:
                broker.flushdb()
                log = logs / f"worker-{scenario.key}.log"
                env = scenario_env(scenario, settings, databases, None)
                with running_worker(scenario, env, log) as worker:
                    for variant in VARIANTS:
                        run_key = f"bench:{scenario.key}:{variant}:{round_no}"
                        run = publish_run(
                            scenario, variant, settings.tasks, run_key, worker.pid, env
                        )
                        runs.append(run)
                        line = (
                            f"round {round_no + 1}  {scenario.label:<31} "
                            f"{VARIANT_LABELS[variant]:<10} {run.rate:8.1f} tasks/s"
                        )
                        if scenario.key == "pikku":
                            check = check_mirror(mirror, run_key, settings.tasks, variant)
                            line += f"   mirror: {check.describe()}"
                            if not check.ok:
                                problems.append(f"{run_key}: {check.describe()}")
                        say(line)
                failures = mirror_failures(log)
                if failures:
                    problems.append(
                        f"the {scenario.key} worker logged {len(failures)} mirror failures, "
                        f"the first: {failures[0]}"
                    )
    finally:
        mirror.dispose()
        broker.close()
    return runs, problems


# --- diagnosis: each side alone, and the database's floor -------------------------


@dataclass(frozen=True)
class Split:
    """The publish path with no worker running, then the worker draining a full queue."""

    scenario: str
    variant: str
    tasks: int
    publish: float
    drain: float
    cpu: dict[str, float]


def split_run(
    scenario: Scenario, variant: str, settings: Settings, databases: Databases, logs: Path
) -> Split:
    broker = redis.Redis.from_url(settings.redis_url)
    broker.flushdb()
    env = scenario_env(scenario, settings, databases, None)
    run = f"bench:{scenario.key}:{variant}:split"
    tasks = min(settings.tasks, SPLIT_TASKS)
    published = publisher("enqueue", variant, tasks, run, 0, env)["publish"]
    timeout = 60 + tasks * ATTEMPTS[variant] / MIN_TASKS_PER_SECOND
    log = logs / f"worker-{scenario.key}-split.log"
    try:
        # Not waiting for a ping: the worker starts on the queue as soon as it is up.
        with running_worker(scenario, env, log, ready=False) as worker:

            def alive() -> bool:
                return worker.poll() is None

            warmed = wait_done(broker, f"{run}:warm", DRAIN_WARMUP_TASKS, timeout, alive)
            before = cpu_snapshot(worker.pid)
            finished = wait_done(broker, run, tasks, timeout, alive)
            after = cpu_snapshot(worker.pid)
    finally:
        broker.close()
    return Split(
        scenario.key,
        variant,
        tasks,
        published,
        finished - warmed,
        cpu_delta(before, after),
    )


def report_splits(splits: Sequence[Split]) -> None:
    say()
    say(
        "Each side alone: publishing with no worker running, then a worker draining "
        "the full queue (CPU ms per task while draining)"
    )
    rows = []
    for split in splits:
        per_task = [
            f"{split.cpu.get(name, 0.0) / split.tasks * 1000:.2f}"
            for name in ("worker main", "worker children", "postgres", "redis", "other")
        ]
        rows.append(
            [
                BY_KEY[split.scenario].label,
                VARIANT_LABELS[split.variant],
                f"{split.publish / split.tasks * 1e6:.0f}",
                f"{split.tasks / split.publish:.0f}",
                f"{split.tasks / split.drain:.1f}",
                *per_task,
            ]
        )
    header = [
        "scenario", "variant", "publish µs/task", "publish tasks/s", "drain tasks/s",
        "worker main ms", "worker children ms", "postgres ms", "redis ms", "other ms",
    ]  # fmt: skip
    table(header, rows)


def database_floor(url: str) -> tuple[float, float]:
    """Median µs of a bare ``SELECT 1`` round trip and of a one-row INSERT committed."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS bench_floor (id serial, v text)")
            conn.commit()
            raw: Any = conn.connection.dbapi_connection
            cursor = raw.cursor()
            trips: list[float] = []
            commits: list[float] = []
            for _ in range(FLOOR_SAMPLES):
                clock = time.perf_counter()
                cursor.execute("SELECT 1")
                cursor.fetchone()
                raw.commit()
                trips.append(time.perf_counter() - clock)
                clock = time.perf_counter()
                cursor.execute("INSERT INTO bench_floor (v) VALUES (%s)", ("x",))
                raw.commit()
                commits.append(time.perf_counter() - clock)
    finally:
        engine.dispose()
    return statistics.median(trips) * 1e6, statistics.median(commits) * 1e6


# --- profiling ------------------------------------------------------------------

# (file suffix, function name) of the frames whose cumulative time is reported.
PUBLISH_FRAMES: Final = {
    "Task.apply_async": ("celery/app/task.py", "apply_async"),
    "pikku before_task_publish": ("pikku_celery/integration/signals.py", "before_task_publish"),
    "SQL execute (incl. BEGIN)": ("sqlalchemy/engine/default.py", "do_execute"),
    "SQL commit": ("sqlalchemy/engine/default.py", "do_commit"),
    "JSON encode (store codec)": ("pikku_celery/store/codec.py", "encode"),
}
CHILD_FRAMES: Final = {
    "task trace (all of it)": ("celery/app/trace.py", "fast_trace_task"),
    "pikku task_prerun": ("pikku_celery/integration/signals.py", "task_prerun"),
    "pikku task_retry": ("pikku_celery/integration/signals.py", "task_retry"),
    "pikku task_success": ("pikku_celery/integration/signals.py", "task_success"),
    "pikku before_task_publish (retry)": (
        "pikku_celery/integration/signals.py",
        "before_task_publish",
    ),
    "Celery backend store_result": ("celery/backends/base.py", "store_result"),
    "SQL execute (incl. BEGIN)": ("sqlalchemy/engine/default.py", "do_execute"),
    "SQL commit": ("sqlalchemy/engine/default.py", "do_commit"),
}
MAIN_FRAMES: Final = {
    "task events sent (EventDispatcher.send)": ("celery/events/dispatcher.py", "send"),
    "messages received (Request.__init__)": ("celery/worker/request.py", "__init__"),
}


@dataclass
class PathProfile:
    """What one side of the work cost, summed over its processes."""

    units: int = 0
    executions: int = 0
    statements: Counter[str] = field(default_factory=Counter)
    autocommit: int = 0
    begins: int = 0
    transactions: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def statement_count(self) -> int:
        return sum(self.statements.values())

    def per_unit(self, value: float) -> float:
        return value / self.units if self.units else 0.0


def load_profile(files: Sequence[Path], frames: Mapping[str, tuple[str, str]]) -> PathProfile:
    result = PathProfile()
    stats: pstats.Stats | None = None
    for stem in files:
        summary = json.loads(stem.with_suffix(".json").read_text())
        result.units += summary["tasks"]
        result.executions += summary["executions"]
        result.statements.update(summary["statements"])
        result.autocommit += summary["autocommit"]
        result.begins += summary["begins"]
        result.transactions += summary["transactions"]
        prof = stem.with_suffix(".prof")
        if stats is None:
            stats = pstats.Stats(str(prof))
        else:
            stats.add(str(prof))
    if stats is None:
        return result
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    for label, (suffix, function) in frames.items():
        result.seconds[label] = sum(
            entry[3]
            for (filename, _line, name), entry in table.items()
            if name == function and filename.replace("\\", "/").endswith(suffix)
        )
    return result


@dataclass(frozen=True)
class ProfileResult:
    scenario: str
    variant: str
    run: Run
    publisher: PathProfile
    children: PathProfile
    main: PathProfile


def profile_run(
    scenario: Scenario, variant: str, settings: Settings, databases: Databases, logs: Path
) -> ProfileResult:
    tasks = min(settings.tasks, PROFILE_TASKS)
    with tempfile.TemporaryDirectory(prefix="celery-bench-profile-") as tmp:
        profile_dir = Path(tmp)
        redis.Redis.from_url(settings.redis_url).flushdb()
        env = scenario_env(scenario, settings, databases, profile_dir)
        log = logs / f"worker-{scenario.key}-profile.log"
        run_key = f"bench:{scenario.key}:{variant}:profile"
        with running_worker(scenario, env, log) as worker:
            run = publish_run(scenario, variant, tasks, run_key, worker.pid, env)
        children = sorted(path.with_suffix("") for path in profile_dir.glob("child-*.json"))
        mains = sorted(path.with_suffix("") for path in profile_dir.glob("main-*.json"))
        if not children or not mains:
            raise SystemExit(f"the worker left no profile; see {log}")
        publisher = load_profile([profile_dir / "publisher"], PUBLISH_FRAMES)
        child_profile = load_profile(children, CHILD_FRAMES)
        main_profile = load_profile(mains, MAIN_FRAMES)
        # The main process runs no task: count its work per task the children finished.
        main_profile.units = child_profile.units
    return ProfileResult(scenario.key, variant, run, publisher, child_profile, main_profile)


def describe_path(name: str, path: PathProfile) -> list[str]:
    per = path.per_unit
    statements = ", ".join(
        f"{per(count):.2f} {verb}" for verb, count in path.statements.most_common()
    )
    round_trips = path.statement_count + path.begins + path.transactions
    if not path.statement_count:
        lines = [f"  {name}: no SQL"]
    else:
        lines = [
            f"  {name}: {per(path.statement_count):.2f} SQL statements per task ({statements}); "
            f"{per(path.transactions):.2f} transactions (BEGIN ... COMMIT), "
            f"{per(path.autocommit):.2f} statements in autocommit; "
            f"{per(round_trips):.2f} round trips to PostgreSQL"
        ]
    for label, seconds in path.seconds.items():
        if seconds:
            lines.append(f"      {label:<42} {per(seconds) * 1e6:9.0f} µs per task")
    return lines


def report_profiles(profiles: Sequence[ProfileResult]) -> None:
    say()
    say("Where the time goes (cProfile wall time per task; profiling slows every path)")
    for result in profiles:
        say()
        scenario = BY_KEY[result.scenario]
        say(
            f"{scenario.label}, {VARIANT_LABELS[result.variant]}, {result.run.tasks} tasks "
            f"({result.run.rate:.0f} tasks/s under the profiler)"
        )
        for line in describe_path("publish path (publisher process)", result.publisher):
            say(line)
        for line in describe_path("worker path (pool children)", result.children):
            say(line)
        for line in describe_path("worker main process", result.main):
            say(line)


# --- the report -----------------------------------------------------------------


def best(runs: Sequence[Run], scenario: str, variant: str) -> Run | None:
    matching = [run for run in runs if run.scenario == scenario and run.variant == variant]
    return max(matching, key=lambda run: run.rate) if matching else None


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * width for width in widths], *rows]:
        say("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def targets(
    runs: Sequence[Run], measure: Callable[[Run], float] = lambda run: run.rate
) -> dict[str, tuple[float, float]]:
    """Per variant: (c)/(a) and (c)/(b) of ``measure`` (tasks per second by default)."""
    ratios: dict[str, tuple[float, float]] = {}
    for variant in VARIANTS:
        plain, dbbackend, pikku = (
            best(runs, key, variant) for key in ("plain", "dbbackend", "pikku")
        )
        if plain and dbbackend and pikku and measure(plain) and measure(dbbackend):
            ratios[variant] = (
                measure(pikku) / measure(plain),
                measure(pikku) / measure(dbbackend),
            )
    return ratios


def report(runs: Sequence[Run], settings: Settings) -> dict[str, tuple[float, float]]:
    say()
    say(
        f"Tasks per second, {settings.tasks:,} tasks per run, best of {settings.rounds}, "
        f"worker --pool=prefork -c {CONCURRENCY}, {os.cpu_count()} CPUs"
    )
    rows: list[list[str]] = []
    for scenario in SCENARIOS:
        for variant in VARIANTS:
            top = best(runs, scenario.key, variant)
            if top is None:
                continue
            every = [
                f"{run.rate:.0f}"
                for run in runs
                if run.scenario == scenario.key and run.variant == variant
            ]
            cpu = [f"{top.cpu.get(name, 0.0) / top.tasks * 1000:.2f}" for name in COMPONENTS]
            busy = top.cpu.get("machine busy", 0.0) / max(top.cpu.get("machine total", 1.0), 1e-9)
            rows.append(
                [
                    scenario.label,
                    VARIANT_LABELS[variant],
                    f"{top.rate:.1f}",
                    " / ".join(every),
                    f"{top.publish:.2f}",
                    f"{top.elapsed:.2f}",
                    *cpu,
                    f"{busy:.0%}",
                    f"{top.cpu_ms:.2f}",
                    f"{top.ceiling:.0f}",
                ]
            )
    header = [
        "scenario", "variant", "tasks/s", "rounds", "publish s", "total s",
        *(f"{name} ms" for name in COMPONENTS), "CPUs busy", "bench ms", "CPU-bound tasks/s",
    ]  # fmt: skip
    table(header, rows)
    say(
        "(CPU milliseconds per task of the best run, by process; 'other' is CPU the "
        "machine spent outside the bench, e.g. a concurrent test suite, and makes the "
        "tasks/s pessimistic. 'bench ms' sums the bench's own processes; 'CPU-bound "
        "tasks/s' is what that cost allows with every CPU on it.)"
    )
    ratios = targets(runs)
    by_cpu = targets(runs, lambda run: run.ceiling)
    say()
    ratio_rows = []
    for variant, (of_plain, of_dbbackend) in ratios.items():
        cpu_plain, cpu_dbbackend = by_cpu.get(variant, (0.0, 0.0))
        ratio_rows.append(
            [
                VARIANT_LABELS[variant],
                f"{of_plain:.2f}",
                "met" if of_plain >= TARGET_OF_PLAIN else "MISSED",
                f"{of_dbbackend:.2f}",
                "met" if of_dbbackend >= TARGET_OF_DBBACKEND else "MISSED",
                f"{cpu_plain:.2f}",
                f"{cpu_dbbackend:.2f}",
            ]
        )
    table(
        [
            "variant",
            "c/a",
            f"target c/a >= {TARGET_OF_PLAIN}",
            "c/b",
            f"target c/b >= {TARGET_OF_DBBACKEND:g}",
            "c/a by CPU cost",
            "c/b by CPU cost",
        ],
        ratio_rows,
    )
    return ratios


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.celery_bench",
        description="Celery tasks per second on a prefork worker: plain, with Celery's "
        "database result backend, and with the pikku mirror; no-op and retry-once tasks.",
    )
    parser.add_argument("--tasks", type=int, help="tasks per run (default 2000, --quick 200)")
    parser.add_argument(
        "--rounds", type=int, help="rounds; the best is kept (default 2, --quick 1)"
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
        help=f"the broker (default {DEFAULT_REDIS_URL}); this database is flushed",
    )
    parser.add_argument("--quick", action="store_true", help="200 tasks, one round")
    parser.add_argument(
        "--profile",
        choices=("auto", "always", "never"),
        default="auto",
        help="profile (b) and (c) after the timed runs: when (c) misses a target (auto)",
    )
    # The publisher process the driver starts for every run.
    parser.add_argument(
        "--role", choices=("driver", "publish"), default="driver", help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--mode", choices=("timed", "enqueue"), default="timed", help=argparse.SUPPRESS
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
        profile=args.profile,
        pg_url=args.pg_url,
        redis_url=args.redis_url,
    )
    if settings.tasks < 1 or settings.rounds < 1:
        raise SystemExit("--tasks and --rounds must be at least 1")
    started = time.perf_counter()
    databases = Databases(settings.pg_url)
    databases.create()
    problems: list[str] = []
    try:
        _, pikku = build_app("pikku", settings.redis_url, databases.url(MIRROR_DATABASE))
        assert pikku is not None
        pikku.store.init()
        pikku.store.close()
        with tempfile.TemporaryDirectory(prefix="celery-bench-") as tmp:
            logs = Path(tmp)
            runs, found = measure(settings, databases, logs)
            problems.extend(found)
            ratios = report(runs, settings)
            missed = any(
                of_plain < TARGET_OF_PLAIN or of_dbbackend < TARGET_OF_DBBACKEND
                for of_plain, of_dbbackend in ratios.values()
            )
            if settings.profile == "always" or (settings.profile == "auto" and missed):
                say()
                say("Diagnosis: each side alone, the database floor, then cProfile")
                splits = [
                    split_run(scenario, "noop", settings, databases, logs) for scenario in SCENARIOS
                ]
                report_splits(splits)
                trip, commit = database_floor(databases.url(MIRROR_DATABASE))
                say()
                say(
                    f"PostgreSQL floor (psycopg, bench otherwise idle): "
                    f"SELECT 1 round trip {trip:.0f} µs, one-row INSERT + COMMIT {commit:.0f} µs"
                )
                profiles = [
                    profile_run(BY_KEY[key], variant, settings, databases, logs)
                    for key, variant in (
                        ("pikku", "noop"),
                        ("pikku", "retry"),
                        ("dbbackend", "noop"),
                    )
                ]
                report_profiles(profiles)
    finally:
        redis.Redis.from_url(settings.redis_url).flushdb()
        databases.drop()
    say()
    for problem in problems:
        say(f"MIRROR PROBLEM: {problem}")
    say(f"done in {time.perf_counter() - started:.0f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
