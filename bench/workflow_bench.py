"""A durable workflow against the same steps as a Celery chain, on one real worker.

Run from the project root::

    python -m bench.workflow_bench            # 20 steps, 20 runs of each kind; 65-100 s here
    python -m bench.workflow_bench --quick    # 5 runs of each kind, no pg_stat cross-check

Every kind runs a no-op step, ``inc(x) -> x + 1``, ``--steps`` times in a
row, on one ``celery worker --pool=prefork -c 2`` with Redis as the broker
and the mirror on PostgreSQL:

* ``workflow``: ``@pikku.workflow("seq")`` doing ``x = ctx.do("inc", inc, x)``
  in a loop, started with ``seq.start(steps)``;
* ``chain``: ``chain(inc.s(0), inc.s(), ...)`` of the same ``@pikku.step``
  task, published with ``pikku.run(chain, name="chain")``;
* ``celery``: the same chain of a plain ``@app.task``, which pikku does not
  mirror. It is not part of the target: it shows what Celery alone costs.

By default one run is in flight at a time (``--concurrent 1``): a run is
started, waited for, then the next one starts, so the figure is the latency
of a step, not the worker's throughput. The kinds take turns run by run, in
a rotating order, so a slow spell of the shared machine falls on every kind
alike. A run lasts from the moment the bench calls ``start``/``run`` until
the time the worker stamped on the write that completed the run
(``workflow_runs.updated_at``; same host, same clock), so the backoff of the
bench's polling does not inflate it. Two runs of each kind warm up first.

SQL statements are counted with a SQLAlchemy ``before_cursor_execute``
listener in every process that talks to the bench database: the bench
process (publishing: ``seq.start``, ``pikku.run``) and each pool child of
the worker (the mirror's signal handlers, the orchestrator, the step's
duplicate check). Each statement is labelled with the ``WorkflowStore``
method that sent it, and the time spent in it is summed (so is the time of
each commit). ``BEGIN`` and ``COMMIT``, which psycopg sends on its own, are
not statements here; transactions are counted separately (each autocommit
statement, each commit). The bench's own polling for the end of a run is
counted apart and left out of the per-step figures. CPU time comes from
``/proc`` for the worker's processes and the bench database's backends.

As a cross-check, ``pg_stat_database`` gives the transactions the server saw
for the bench database: over the whole timed phase, then over three more
untimed runs of each kind. Each read waits until idle backends have flushed
their statistics, which PostgreSQL 15 does within 10 s (``--stats-wait``).

This module is also the worker's app: ``celery -A bench.workflow_bench
worker`` builds it from ``WFBENCH_*`` environment variables at import. The
bench creates and drops its own database (``pikku_bench_workflow``) and
flushes its Redis database first.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import redis
import sqlalchemy as sa
from celery import Celery, chain, signals
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

import pikku_celery.integration.mirror
import pikku_celery.store
from bench.workers import stop_worker, wait_ready
from pikku_celery import PikkuCelery
from pikku_celery.store import StepAttempt
from pikku_celery.workflows.definition import Workflow

BROKER_ENV: Final = "WFBENCH_BROKER_URL"
DATABASE_ENV: Final = "WFBENCH_DATABASE_URL"
COUNT_DIR_ENV: Final = "WFBENCH_COUNT_DIR"

DEFAULT_PG_URL: Final = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/10"
DATABASE: Final = "pikku_bench_workflow"
ROOT: Final = Path(__file__).resolve().parent.parent

TASK_NAME: Final = "bench.workflow.inc"
PLAIN_TASK_NAME: Final = "bench.workflow.plain_inc"
PLAIN_LAST_TASK_NAME: Final = "bench.workflow.plain_last"
WORKFLOW_NAME: Final = "seq"
CHAIN_NAME: Final = "chain"
KINDS: Final = ("workflow", "chain", "celery")
CONCURRENCY: Final = 2
WARMUP_RUNS: Final = 2
# Runs of each kind for the per-kind pg_stat_database cross-check (not timed).
CHECK_RUNS: Final = 3
# Who sent SQL to the bench database: the worker's children, and this process
# publishing and polling ("other" is this process's other SQL, e.g. the admin
# connection to another database).
SECTIONS: Final = ("worker", "publish", "poll")
TARGET: Final = 2.0
# PostgreSQL 15 flushes an idle backend's statistics within 10 s.
STATS_WAIT: Final = 11.0
_STORE_DIR: Final = str(Path(pikku_celery.store.__file__).resolve().parent)
_MIRROR_FILE: Final = str(Path(pikku_celery.integration.mirror.__file__).resolve())
# Store methods whose label says which status they wrote (their SQL differs by it).
_BY_STATUS: Final = frozenset({"record_attempt", "claim_step", "move_run"})


def say(text: str = "") -> None:
    print(text, flush=True)


# --- statement counting (every process) ---------------------------------------------


def _caller() -> str:
    """What sent a statement or a commit: the outermost public ``WorkflowStore`` method
    on the stack, else the ``CeleryMirror`` method (a transaction the mirror opened)."""
    frame: Any = sys._getframe(2)
    store: str | None = None
    mirror: str | None = None
    while frame is not None:
        code = frame.f_code
        name = code.co_name
        if not name.startswith(("_", "<")):
            if code.co_filename.startswith(_STORE_DIR):
                store = name
                if name in _BY_STATUS:
                    status = frame.f_locals.get("status")
                    store = f"{name}({status})" if isinstance(status, str) else name
            elif code.co_filename == _MIRROR_FILE and name not in ("write", "record"):
                mirror = f"mirror.{name}"
        frame = frame.f_back
    return store or mirror or "other"


@dataclass
class Counts:
    """Statements (``section:store method``), transactions and tasks, summed over processes."""

    statements: Counter[str] = field(default_factory=Counter)
    transactions: Counter[str] = field(default_factory=Counter)
    tasks: Counter[str] = field(default_factory=Counter)
    #: Milliseconds spent waiting in psycopg's execute and commit, keyed like
    #: ``statements`` (a commit as ``section:COMMIT method``).
    sql_ms: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "statements": dict(self.statements),
            "transactions": dict(self.transactions),
            "tasks": dict(self.tasks),
            "sql_ms": self.sql_ms,
        }

    def add(self, other: Counts) -> None:
        self.statements.update(other.statements)
        self.transactions.update(other.transactions)
        self.tasks.update(other.tasks)
        for key, value in other.sql_ms.items():
            self.sql_ms[key] = self.sql_ms.get(key, 0.0) + value

    def minus(self, other: Counts) -> Counts:
        return Counts(
            Counter(_delta(self.statements, other.statements)),
            Counter(_delta(self.transactions, other.transactions)),
            Counter(_delta(self.tasks, other.tasks)),
            {key: value - other.sql_ms.get(key, 0.0) for key, value in self.sql_ms.items()},
        )

    def statements_in(self, *sections: str) -> int:
        return sum(n for key, n in self.statements.items() if key.split(":", 1)[0] in sections)

    def sql_ms_in(self, *sections: str) -> float:
        return sum(ms for key, ms in self.sql_ms.items() if key.split(":", 1)[0] in sections)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        return cls(
            Counter(data.get("statements", {})),
            Counter(data.get("transactions", {})),
            Counter(data.get("tasks", {})),
            dict(data.get("sql_ms", {})),
        )


def _delta(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key)}


class Probe:
    """Counts this process's statements and transactions against the bench database.

    ``section`` says on whose behalf: ``worker`` in the worker's children;
    ``publish``, ``poll`` or ``other`` in the bench process.
    """

    def __init__(self, section: str) -> None:
        self.section = section
        self.counts = Counts()
        self._started = 0.0
        self._label = "other"

    def install(self) -> None:
        # On the Engine class: the store's engine and its autocommit view alike,
        # and the engine a forked child makes after dropping its parent's pool.
        sa.event.listen(sa.Engine, "before_cursor_execute", self._statement)
        sa.event.listen(sa.Engine, "after_cursor_execute", self._statement_done)
        sa.event.listen(sa.Engine, "commit", self._commit)
        # SQLAlchemy has no event after a commit: time the dialect's own call.
        commit: Callable[[Any, Any], None] = PGDialect_psycopg.do_commit

        def timed_commit(dialect: Any, dbapi_connection: Any) -> None:
            label = f"COMMIT {_caller()}"
            started = time.perf_counter()
            try:
                commit(dialect, dbapi_connection)
            finally:
                self._add_sql_time(label, started)

        PGDialect_psycopg.do_commit = timed_commit  # type: ignore[method-assign]

    def reset(self) -> None:
        self.counts = Counts()

    def _add_sql_time(self, label: str, started: float) -> None:
        key = f"{self.section}:{label}"
        elapsed = (time.perf_counter() - started) * 1000
        self.counts.sql_ms[key] = self.counts.sql_ms.get(key, 0.0) + elapsed

    def _statement(self, conn: Any, cursor: Any, *_: Any) -> None:
        self._label = _caller()
        self.counts.statements[f"{self.section}:{self._label}"] += 1
        # In autocommit every statement is a transaction of its own on the server.
        if getattr(cursor.connection, "autocommit", False):
            self.counts.transactions[self.section] += 1
        self._started = time.perf_counter()  # last: the labelling is not SQL time

    def _statement_done(self, *_: Any) -> None:
        self._add_sql_time(self._label, self._started)

    def _commit(self, conn: Any) -> None:
        if not getattr(conn.connection.dbapi_connection, "autocommit", False):
            self.counts.transactions[self.section] += 1

    @contextmanager
    def on_behalf(self, section: str) -> Iterator[None]:
        previous, self.section = self.section, section
        try:
            yield
        finally:
            self.section = previous


def _install_worker_probe(count_dir: Path) -> None:
    """Count in each pool child; after each task, write its running totals to a file.

    Written in ``task_postrun``, once the task's mirror writes and the replay
    it queued are done, so once the files add up to every task the runs
    needed, they hold all of those runs' SQL.
    """
    probe = Probe("worker")
    probe.install()
    files: dict[int, int] = {}

    def child_start(**_: Any) -> None:
        probe.reset()  # not the parent's counts

    def flush(sender: Any = None, **_: Any) -> None:
        probe.counts.tasks[str(getattr(sender, "name", "?"))] += 1
        pid = os.getpid()
        fd = files.get(pid)
        if fd is None:
            path = count_dir / f"worker-{pid}.json"
            fd = files[pid] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        # Kept open and rewritten in place: about 10 us, where a new file and a
        # rename took 200 us, a cost that would fall twice as often on a workflow
        # step (two tasks) as on a chain step. A reader catching it between the
        # truncate and the write sees an empty file and reads again.
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(probe.counts.as_json()).encode(), 0)

    signals.worker_process_init.connect(child_start, weak=False, dispatch_uid="wfbench.start")
    signals.task_postrun.connect(flush, weak=False, dispatch_uid="wfbench.flush")


def worker_counts(count_dir: Path) -> Counts:
    total = Counts()
    for path in count_dir.glob("worker-*.json"):
        for _ in range(50):
            try:
                total.add(Counts.from_json(json.loads(path.read_text())))
                break
            except (OSError, ValueError):
                time.sleep(0.001)  # caught between the truncate and the write
        else:
            raise SystemExit(f"cannot read the worker's counts in {path}")
    return total


# --- the benchmark app (worker and bench process) --------------------------------------


_clients: dict[tuple[int, str], redis.Redis] = {}


def redis_client(url: str) -> redis.Redis:
    """One client per process: a forked pool child must not share its parent's socket."""
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(url)
    return client


@dataclass(frozen=True)
class BenchApp:
    app: Celery
    pikku: PikkuCelery
    inc: Any
    seq: Workflow
    plain_inc: Any
    plain_last: Any


def build_app(broker_url: str, database_url: str) -> BenchApp:
    app = Celery("workflow_bench", broker=broker_url)
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    pikku = PikkuCelery(app, database_url=database_url)

    @pikku.step(name=TASK_NAME)
    def inc(x: int) -> int:
        return x + 1

    @pikku.workflow(WORKFLOW_NAME)
    def seq(ctx: Any, steps: int) -> int:
        x = 0
        for _ in range(steps):
            x = ctx.do("inc", inc, x)
        return x

    # The floor: the same chain of plain Celery tasks, which pikku does not mirror.
    @app.task(name=PLAIN_TASK_NAME)
    def plain_inc(x: int) -> int:
        return x + 1

    @app.task(name=PLAIN_LAST_TASK_NAME)
    def plain_last(x: int, key: str) -> int:
        # No run row to read the end from: the last link says when it ran.
        redis_client(broker_url).rpush(key, json.dumps([time.time(), x + 1]))
        return x + 1

    return BenchApp(app, pikku, inc, seq, plain_inc, plain_last)


def _app_from_env() -> Celery | None:
    broker_url = os.environ.get(BROKER_ENV)
    database_url = os.environ.get(DATABASE_ENV)
    if not broker_url or not database_url:
        return None
    count_dir = os.environ.get(COUNT_DIR_ENV)
    if count_dir:
        _install_worker_probe(Path(count_dir))
    return build_app(broker_url, database_url).app


#: What ``celery -A bench.workflow_bench`` loads (None outside the worker).
app = _app_from_env()


# --- the worker, the database, CPU ------------------------------------------------------


class Database:
    """The bench's own database on the PostgreSQL server, dropped at the end."""

    def __init__(self, admin_url: str) -> None:
        parsed = make_url(admin_url)
        if parsed.get_backend_name() not in ("postgresql", "postgres"):
            raise SystemExit(f"--pg-url must be a postgresql:// URL, not {parsed.drivername}://")
        if parsed.database == DATABASE:
            raise SystemExit(f"--pg-url names {DATABASE!r}, which the bench drops; use another.")
        self._url = parsed.set(drivername="postgresql+psycopg")
        self._admin = sa.create_engine(self._url, isolation_level="AUTOCOMMIT")

    @property
    def url(self) -> str:
        return self._url.set(database=DATABASE).render_as_string(hide_password=False)

    def create(self) -> None:
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
            conn.exec_driver_sql(f"CREATE DATABASE {DATABASE}")

    def drop(self) -> None:
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        self._admin.dispose()

    def transactions(self) -> int:
        """Transactions the server has counted for the bench database so far."""
        query = sa.text(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :name"
        )
        with self._admin.connect() as conn:
            return int(conn.execute(query, {"name": DATABASE}).scalar_one())

    def settled_transactions(self, wait: float) -> int:
        time.sleep(wait)  # idle backends flush their pending statistics meanwhile
        return self.transactions()


CPU_PARTS: Final = ("worker children", "worker main", "postgres backends", "bench process")


def cpu_snapshot(worker_pid: int) -> dict[str, float]:
    """CPU seconds used so far by the worker's processes and the bench database's backends.

    Empty where there is no ``/proc``. Other databases' backends (other
    users of the server) are not counted.
    """
    if not Path("/proc/stat").exists():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    used: Counter[str] = Counter()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
            command = text[text.index("(") + 1 : text.rindex(")")]
            rest = text[text.rindex(")") + 2 :].split()
            if command == "postgres":
                title = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue  # gone since the listing
        pid, parent, ticks = int(entry.name), int(rest[1]), int(rest[11]) + int(rest[12])
        if pid == worker_pid:
            used["worker main"] += ticks
        elif parent == worker_pid:
            used["worker children"] += ticks
        elif command == "postgres" and f" {DATABASE} " in title:
            used["postgres backends"] += ticks
    return {name: value / tick for name, value in used.items()}


@contextmanager
def running_worker(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [
        sys.executable, "-m", "celery", "-A", "bench.workflow_bench", "worker",
        "--pool=prefork", "-c", str(CONCURRENCY), "-l", "warning",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", "wfbench@%h",
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


def mirror_failures(log: Path) -> list[str]:
    text = log.read_text(errors="replace") if log.exists() else ""
    markers = ("pikku-celery could not record", "pikku-celery signal handler", "Traceback")
    return [line for line in text.splitlines() if any(marker in line for marker in markers)]


# --- running the kinds ------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    kind: str
    run_id: str
    steps: int
    started: dt.datetime
    ended: dt.datetime
    output: Any

    @property
    def ms_per_step(self) -> float:
        return (self.ended - self.started).total_seconds() * 1000 / self.steps


@dataclass
class Tally:
    """What some runs of one kind added up to: their times, SQL, tasks and CPU."""

    kind: str
    runs: list[RunResult] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    cpu: dict[str, float] = field(default_factory=dict)
    tasks_expected: int = 0

    def add(self, other: Tally) -> None:
        self.runs.extend(other.runs)
        self.counts.add(other.counts)
        for name, seconds in other.cpu.items():
            self.cpu[name] = self.cpu.get(name, 0.0) + seconds
        self.tasks_expected += other.tasks_expected


class Bench:
    def __init__(
        self,
        bench: BenchApp,
        probe: Probe,
        count_dir: Path,
        steps: int,
        redis_url: str,
        worker_pid: int,
    ) -> None:
        self.bench = bench
        self.probe = probe
        self.count_dir = count_dir
        self.steps = steps
        self.redis = redis_client(redis_url)
        self.worker_pid = worker_pid
        self.timeout = 30.0 + 2.0 * steps

    def counts(self) -> Counts:
        total = worker_counts(self.count_dir)
        total.add(self.probe.counts)
        return total

    def tasks_per_run(self, kind: str) -> int:
        # A workflow: every step, plus a replay at the start and after each step.
        return 2 * self.steps + 1 if kind == "workflow" else self.steps

    def start(self, kind: str) -> tuple[str, dt.datetime]:
        bench = self.bench
        started = dt.datetime.now(dt.timezone.utc)
        with self.probe.on_behalf("publish"):
            if kind == "workflow":
                run_id = bench.seq.start(self.steps)
            elif kind == "chain":
                links = (bench.inc.s() for _ in range(self.steps - 1))
                run_id = bench.pikku.run(chain(bench.inc.s(0), *links), name=CHAIN_NAME)
            else:
                run_id = f"wfbench:{uuid.uuid4()}"  # the Redis key the last link reports to
                links = (bench.plain_inc.s() for _ in range(self.steps - 2))
                chain(bench.plain_inc.s(0), *links, bench.plain_last.s(run_id)).apply_async()
        return run_id, started

    def finish(self, kind: str, run_id: str, started: dt.datetime) -> RunResult:
        if kind == "celery":
            deadline = time.monotonic() + self.timeout
            answer: Any = None
            while answer is None and time.monotonic() < deadline:
                answer = self.redis.blpop([run_id], timeout=1)
            if answer is None:
                raise SystemExit(f"the plain chain {run_id} did not finish in {self.timeout} s")
            at, output = json.loads(answer[1])
            ended = dt.datetime.fromtimestamp(at, dt.timezone.utc)
            return RunResult(kind, run_id, self.steps, started, ended, output)
        with self.probe.on_behalf("poll"):
            # pikku.wait only reads the run, so it serves a chain's run as well.
            output = self.bench.pikku.wait(run_id, timeout=self.timeout)
            run = self.bench.pikku.store.get_run(run_id)
        return RunResult(kind, run_id, self.steps, started, run.updated_at, output)

    def quiesce(self, before: Counts, expected: int) -> Counts:
        """The counts once the worker has run (and counted) every task the runs needed."""
        deadline = time.monotonic() + self.timeout
        while True:
            delta = self.counts().minus(before)
            if sum(delta.tasks.values()) >= expected or time.monotonic() > deadline:
                return delta
            time.sleep(0.01)

    def batch(self, kind: str, count: int) -> Tally:
        """``count`` runs of ``kind`` in flight together, until the worker is idle again.

        Extra tasks (a duplicate replay) would be counted in the next batch and
        show up as a kind's task count differing from the expected one.
        """
        before, cpu_before = self.counts(), cpu_snapshot(self.worker_pid)
        ours = os.times()
        started = [self.start(kind) for _ in range(count)]
        runs = [self.finish(kind, run_id, at) for run_id, at in started]
        expected = count * self.tasks_per_run(kind)
        counts = self.quiesce(before, expected)
        ours_after = os.times()
        cpu_after = cpu_snapshot(self.worker_pid)
        cpu = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
        # Our own CPU without the /proc scans around it.
        cpu["bench process"] = (ours_after.user + ours_after.system) - (ours.user + ours.system)
        return Tally(kind, runs, counts, cpu, expected)


# --- analysis -------------------------------------------------------------------------


def p90(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[8]


@dataclass(frozen=True)
class ServerCheck:
    """Transactions ``pg_stat_database`` saw over some runs, and what the processes counted."""

    runs: int
    server: int
    pikku: int
    polling: int


@dataclass
class KindSummary:
    tally: Tally
    steps: int
    server: ServerCheck | None = None

    @property
    def kind(self) -> str:
        return self.tally.kind

    @property
    def runs(self) -> list[RunResult]:
        return self.tally.runs

    @property
    def counts(self) -> Counts:
        return self.tally.counts

    @property
    def cpu(self) -> dict[str, float]:
        return self.tally.cpu

    @property
    def step_count(self) -> int:
        return len(self.runs) * self.steps

    @property
    def median(self) -> float:
        return statistics.median(run.ms_per_step for run in self.runs)

    @property
    def p90(self) -> float:
        return p90([run.ms_per_step for run in self.runs])

    @property
    def statements(self) -> int:
        return self.counts.statements_in("worker", "publish")

    @property
    def transactions(self) -> int:
        return pikku_transactions(self.counts)

    @property
    def tasks(self) -> int:
        return sum(self.counts.tasks.values())

    def per_step(self, value: float) -> float:
        return value / self.step_count

    @property
    def server_per_step(self) -> float | None:
        """pg_stat_database's transactions per step, less the bench's polling."""
        if self.server is None:
            return None
        return (self.server.server - self.server.polling) / (self.server.runs * self.steps)


def pikku_transactions(counts: Counts) -> int:
    return counts.transactions["worker"] + counts.transactions["publish"]


def ms(delta: dt.timedelta) -> float:
    return delta.total_seconds() * 1000


@dataclass
class Timeline:
    """Mean milliseconds of each part of a step, from the attempts' own timestamps."""

    parts: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.parts.setdefault(name, []).append(value)

    def mean(self, name: str) -> float:
        values = self.parts.get(name, [])
        return statistics.fmean(values) if values else float("nan")


TIMELINE_PARTS: Final = (
    "step to step",
    "orchestrate",
    "orchestrate, first quarter",
    "orchestrate, last quarter",
    "deliver",
    "run",
    "start to first step scheduled",
    "last step to run completed",
)


def timeline(store: Any, summary: KindSummary) -> Timeline:
    """Where a step's time goes, from steps 2..n (step 1 also carries the start).

    * ``step to step``: one step's success to the next one's;
    * workflow: ``orchestrate`` (a step's success to the next step's claim by
      the replay: the orchestrate message and the replay), ``deliver`` (claim
      to running: the step message and the running write) and ``run``
      (running to succeeded: the duplicate check, the task, the success write);
    * chain: ``deliver`` (the previous link's publish to running) and ``run``
      (which includes publishing the next link).
    """
    result = Timeline()
    quarter = max(1, summary.steps // 4)
    for run in summary.runs:
        attempts: list[StepAttempt] = sorted(
            store.get_run_history(run.run_id), key=lambda attempt: attempt.created_at
        )
        if not attempts:
            continue
        if attempts[0].scheduled_at is not None:
            result.add("start to first step scheduled", ms(attempts[0].scheduled_at - run.started))
        if attempts[-1].succeeded_at is not None:
            result.add("last step to run completed", ms(run.ended - attempts[-1].succeeded_at))
        for index in range(1, len(attempts)):
            previous, attempt = attempts[index - 1], attempts[index]
            done, scheduled = previous.succeeded_at, attempt.scheduled_at
            running, succeeded = attempt.running_at, attempt.succeeded_at
            if done is None or scheduled is None or running is None or succeeded is None:
                continue
            result.add("step to step", ms(succeeded - done))
            result.add("deliver", ms(running - scheduled))
            result.add("run", ms(succeeded - running))
            if summary.kind == "workflow":
                hop = ms(scheduled - done)
                result.add("orchestrate", hop)
                if index < quarter:
                    result.add("orchestrate, first quarter", hop)
                if index >= len(attempts) - quarter:
                    result.add("orchestrate, last quarter", hop)
    return result


def _cell(value: float | None, width: int, digits: int = 2) -> str:
    if value is None or value != value:  # missing, or NaN
        return f"{'-':>{width}}"
    return f"{value:{width}.{digits}f}"


def report(
    summaries: dict[str, KindSummary], timelines: dict[str, Timeline], concurrent: int
) -> bool:
    workflow, chain_ = summaries["workflow"], summaries["chain"]
    floor = summaries.get("celery")
    shown = [workflow, chain_] + ([floor] if floor else [])
    say()
    say(
        f"{workflow.steps} steps per run, {len(workflow.runs)} runs of each kind, "
        f"{concurrent} run(s) in flight at a time"
    )
    say()
    header = (
        f"{'kind':<9} {'steps':>5} {'runs':>4} {'ms/step med':>11} {'ms/step p90':>11} "
        f"{'stmts/step':>10} {'xacts/step':>10} {'pg xacts/step':>13} {'tasks/step':>10}"
    )
    say(header)
    say("-" * len(header))

    def row(summary: KindSummary) -> None:
        server = summary.server_per_step
        say(
            f"{summary.kind:<9} {summary.steps:>5} {len(summary.runs):>4} "
            f"{_cell(summary.median, 11)} {_cell(summary.p90, 11)} "
            f"{_cell(summary.per_step(summary.statements), 10)} "
            f"{_cell(summary.per_step(summary.transactions), 10)} {_cell(server, 13)} "
            f"{_cell(summary.per_step(summary.tasks), 10)}"
        )

    row(workflow)
    row(chain_)
    wall = workflow.median / chain_.median
    wall_p90 = workflow.p90 / chain_.p90
    stmts = workflow.per_step(workflow.statements) / chain_.per_step(chain_.statements)
    xacts = workflow.per_step(workflow.transactions) / chain_.per_step(chain_.transactions)
    say(f"{'ratio':<9} {'':>5} {'':>4} {wall:11.2f} {wall_p90:11.2f} {stmts:10.2f} {xacts:10.2f}")
    if floor is not None:
        say("-" * len(header))
        row(floor)
        say(
            "(celery: the same chain of plain Celery tasks, not mirrored, on the same "
            "worker: what Celery alone costs)"
        )
    say()
    wall_ok, stmts_ok = wall <= TARGET, stmts <= TARGET
    say(
        f"Target, workflow/chain <= {TARGET:g} per step: wall time (median) {wall:.2f} "
        f"{'met' if wall_ok else 'NOT met'}; SQL statements {stmts:.2f} "
        f"{'met' if stmts_ok else 'NOT met'}."
    )
    say(
        "(xacts: transactions counted by the processes; pg xacts: pg_stat_database's "
        "count for the bench database over separate untimed runs, less the bench's polling)"
    )

    say()
    say("Statements per step, by side and the WorkflowStore method that sent them:")
    pikku_sides = ("worker", "publish")
    labels = sorted(
        {
            key
            for summary in (workflow, chain_)
            for key in summary.counts.statements
            if key.split(":", 1)[0] in pikku_sides
        }
    )
    say(f"  {'side:method':<40} {'workflow':>9} {'chain':>9}")
    for label in labels:
        cells = [_cell(s.per_step(s.counts.statements[label]), 9) for s in (workflow, chain_)]
        say(f"  {label:<40} {cells[0]} {cells[1]}")

    say()
    say("SQL wait per step, ms, by side and what sent it (statements, then commits):")
    timed = sorted(
        {
            key
            for summary in (workflow, chain_)
            for key in summary.counts.sql_ms
            if key.split(":", 1)[0] in pikku_sides
        },
        key=lambda key: ("COMMIT" in key, key),
    )
    say(f"  {'side:method':<40} {'workflow':>9} {'chain':>9}")
    for label in timed:
        cells = [_cell(s.per_step(s.counts.sql_ms.get(label, 0.0)), 9) for s in (workflow, chain_)]
        say(f"  {label:<40} {cells[0]} {cells[1]}")

    say()
    say("Per step, ms: waiting on SQL (execute + commit) and CPU by process:")
    names = [s.kind for s in shown]
    say(f"  {'':<40} " + " ".join(f"{name:>9}" for name in names))
    for side in pikku_sides:
        cells = [_cell(s.per_step(s.counts.sql_ms_in(side)), 9) for s in shown]
        say(f"  {'SQL wait, ' + side:<40} " + " ".join(cells))
    for part in CPU_PARTS:
        cells = [_cell(s.per_step(s.cpu[part] * 1000) if part in s.cpu else None, 9) for s in shown]
        say(f"  {'CPU, ' + part:<40} " + " ".join(cells))

    say()
    say("Tasks run by the worker:")
    for summary in shown:
        tasks = ", ".join(f"{name} {n}" for name, n in sorted(summary.counts.tasks.items()))
        say(f"  {summary.kind:<9} {summary.tally.tasks_expected} expected; {tasks}")

    say()
    say("Mean ms per step from the attempts' timestamps (steps 2..n):")
    say(f"  {'part':<40} {'workflow':>9} {'chain':>9}")
    for name in TIMELINE_PARTS:
        cells = [_cell(timelines[kind].mean(name), 9) for kind in ("workflow", "chain")]
        say(f"  {name:<40} {cells[0]} {cells[1]}")
    return wall_ok and stmts_ok


def check_runs(summaries: dict[str, KindSummary], store: Any) -> list[str]:
    problems: list[str] = []
    for summary in summaries.values():
        for run in summary.runs:
            if run.output != summary.steps:
                problems.append(f"{summary.kind} run {run.run_id} returned {run.output!r}")
            if summary.kind == "celery":
                continue
            states = store.list_step_states(run.run_id)
            done = sum(state.status == "succeeded" for state in states)
            if len(states) != summary.steps or done != summary.steps:
                problems.append(
                    f"{summary.kind} run {run.run_id}: {done}/{len(states)} steps succeeded"
                )
        if summary.tasks != summary.tally.tasks_expected:
            problems.append(
                f"{summary.kind}: {summary.tasks} tasks ran, "
                f"{summary.tally.tasks_expected} expected"
            )
    floor = summaries.get("celery")
    if floor is not None and floor.statements:
        problems.append("the plain Celery chain sent SQL: it should not be mirrored")
    return problems


# --- the driver -----------------------------------------------------------------------


def worker_env(database: Database, redis_url: str, count_dir: Path) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("BENCH_", "WFBENCH_", "PIKKU_"))
    }
    env[BROKER_ENV] = redis_url
    env[DATABASE_ENV] = database.url
    env[COUNT_DIR_ENV] = str(count_dir)
    return env


def rotated(kinds: Sequence[str], turn: int) -> list[str]:
    """The kinds in a different order each round, so none always follows the same one."""
    shift = turn % len(kinds)
    return [*kinds[shift:], *kinds[:shift]]


def measure(args: argparse.Namespace, database: Database, work: Path) -> tuple[bool, list[str]]:
    count_dir = work / "counts"
    count_dir.mkdir()
    log = work / "worker.log"
    probe = Probe("other")
    probe.install()
    bench_app = build_app(args.redis_url, database.url)
    store = bench_app.pikku.store
    store.init()
    kinds = [kind for kind in KINDS if kind != "celery" or not args.no_floor]
    tallies = {kind: Tally(kind) for kind in kinds}
    checks: dict[str, ServerCheck] = {}
    total_check: tuple[int, int] | None = None
    try:
        with running_worker(worker_env(database, args.redis_url, count_dir), log) as worker:
            bench = Bench(bench_app, probe, count_dir, args.steps, args.redis_url, worker.pid)
            say(f"worker ready; warming up with {WARMUP_RUNS} runs of each kind")
            for kind in kinds:
                bench.batch(kind, WARMUP_RUNS)
            check = args.stats_wait > 0
            baseline = database.settled_transactions(args.stats_wait) if check else 0
            before = bench.counts()
            # One run (or --concurrent runs) of each kind in turn: a slow spell of the
            # shared machine falls on every kind alike.
            clock = time.monotonic()
            rounds = -(-args.runs // args.concurrent)
            for turn in range(rounds):
                in_flight = min(args.concurrent, args.runs - turn * args.concurrent)
                for kind in rotated(kinds, turn):
                    tallies[kind].add(bench.batch(kind, in_flight))
            say(f"{args.runs} runs of each kind in {time.monotonic() - clock:.1f} s")
            if check:
                # The whole timed phase: what the server saw against what we counted.
                server = database.settled_transactions(args.stats_wait)
                # Not "other": that is the admin connection, to another database.
                delta = bench.counts().minus(before).transactions
                total_check = (server - baseline, sum(delta[s] for s in SECTIONS))
                baseline = server
                # Per kind: a few more runs each, with the server's count settled between.
                for kind in ("workflow", "chain"):
                    extra = bench.batch(kind, 1)
                    for _ in range(CHECK_RUNS - 1):
                        extra.add(bench.batch(kind, 1))
                    server = database.settled_transactions(args.stats_wait)
                    checks[kind] = ServerCheck(
                        runs=CHECK_RUNS,
                        server=server - baseline,
                        pikku=pikku_transactions(extra.counts),
                        polling=extra.counts.transactions["poll"],
                    )
                    baseline = server
        summaries = {
            kind: KindSummary(tallies[kind], args.steps, checks.get(kind)) for kind in kinds
        }
        with probe.on_behalf("other"):
            timelines = {kind: timeline(store, summaries[kind]) for kind in ("workflow", "chain")}
            problems = check_runs(summaries, store)
        ok = report(summaries, timelines, args.concurrent)
        if total_check is not None:
            say()
            say("Cross-check, transactions the server saw for the bench database:")
            server, counted = total_check
            say(
                f"  timed phase, all kinds: pg_stat_database {server}, counted by the "
                f"processes {counted} (pikku and the bench's polling)"
            )
            for kind, result in checks.items():
                say(
                    f"  {result.runs} more {kind} runs: pg_stat_database {result.server}, "
                    f"counted {result.pikku + result.polling} "
                    f"({result.pikku} pikku + {result.polling} polling)"
                )
            say(
                "  (a few more on the server than counted: psycopg prepares a statement on "
                "its 6th use on a connection,\n   a Parse + Sync round trip that is a "
                "transaction of its own and that no SQLAlchemy event sees)"
            )
        failures = mirror_failures(log)
        if failures:
            problems.append(f"the worker logged {len(failures)} failures, first: {failures[0]}")
        return ok, problems
    finally:
        store.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.workflow_bench",
        description="Per-step wall time and SQL of a durable workflow vs a Celery chain.",
    )
    parser.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    parser.add_argument(
        "--runs", type=int, help="measured runs of each kind (default 20; 5 with --quick)"
    )
    parser.add_argument(
        "--concurrent", type=int, default=1, help="runs in flight at once (default 1)"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("PIKKU_BENCH_PG_URL", DEFAULT_PG_URL),
        help=f"PostgreSQL admin URL; the bench creates and drops {DATABASE} on that server",
    )
    parser.add_argument(
        "--redis-url", default=DEFAULT_REDIS_URL, help="broker; this database is flushed first"
    )
    parser.add_argument(
        "--stats-wait",
        type=float,
        help=f"seconds to let PostgreSQL flush statistics before each pg_stat_database "
        f"read (default {STATS_WAIT:g}; 0, the default with --quick, skips the cross-check)",
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the plain Celery chain (the floor)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="5 runs of each kind, no pg_stat cross-check"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = 5 if args.quick else 20
    if args.stats_wait is None:
        args.stats_wait = 0.0 if args.quick else STATS_WAIT
    if args.steps < 2 or args.runs < 1 or args.concurrent < 1:
        parser.error("--steps must be 2 or more, --runs and --concurrent 1 or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    database = Database(args.pg_url)
    redis.Redis.from_url(args.redis_url).flushdb()
    database.create()
    work = Path(tempfile.mkdtemp(prefix="pikku-wfbench-"))
    try:
        ok, problems = measure(args, database, work)
    finally:
        database.drop()
    say()
    if problems:
        say(f"PROBLEMS ({len(problems)}); worker log kept in {work / 'worker.log'}:")
        for problem in problems[:20]:
            say(f"  {problem}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        say("Every run returned its step count, every step succeeded once, no mirror failures.")
    return 1 if (args.check and not ok) or problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
