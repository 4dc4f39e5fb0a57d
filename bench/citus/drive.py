"""``python -m bench.citus drive``: real workers with ``backend="pikku://"`` on a Citus cluster.

For each shard count (``--shards 4,32``) the drive makes a database on every node,
migrates it, distributes it (``pikku-celery db distribute --shards N``) and starts
``--flushers`` prefork workers, each a node with a journal and a flusher of its own. It
then times, through ``get()``: lone no-op tasks, chains whose first link retries once,
groups, chords, and one ``noop.delay().get()`` at a time; checks every answer; waits
until SQL holds every run completed and every step succeeded; and counts the lines
saying "deadlock" in the workers' logs and the nodes' PostgreSQL logs since it began.
``--minutes M`` repeats the mix until M minutes have passed (the long drive).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from celery import chain, chord, group

from bench.citus.app import ADD, FLAKY, JOURNAL_ENV, NOOP, TOTAL, build_app
from bench.citus.cluster import CitusCluster, create_database, drop_database
from bench.harness.broker import DEFAULT_REDIS_URL, flush
from bench.harness.workers import BROKER_ENV, DATABASE_ENV, clean_env, running_worker
from pikku_celery import WorkflowStore

__all__ = ["drive"]

_GET_TIMEOUT = 120.0
_SETTLE_TIMEOUT = 120.0


@dataclass
class Mix:
    """What one pass of the mix took, in seconds, and the latencies of ``get()`` one by one."""

    lone: float = 0.0
    chains: float = 0.0
    groups: float = 0.0
    chords: float = 0.0
    gets: list[float] = field(default_factory=list)
    tasks: int = 0


def _pass(app: object, args: argparse.Namespace) -> Mix:
    tasks = app.tasks  # type: ignore[attr-defined]
    noop, add, flaky, total = tasks[NOOP], tasks[ADD], tasks[FLAKY], tasks[TOTAL]
    mix = Mix()
    started = time.perf_counter()
    results = [noop.delay() for _ in range(args.lone)]
    for result in results:
        result.get(timeout=_GET_TIMEOUT)
    mix.lone = time.perf_counter() - started
    started = time.perf_counter()
    chains = [chain(flaky.s(n), add.s(1)).delay() for n in range(args.chains)]
    for n, result in enumerate(chains):
        assert result.get(timeout=_GET_TIMEOUT) == n + 1, "a chain's answer is wrong"
    mix.chains = time.perf_counter() - started
    started = time.perf_counter()
    groups = [
        group(add.s(n, n) for n in range(args.group_size)).delay() for _ in range(args.groups)
    ]
    for result in groups:
        assert result.get(timeout=_GET_TIMEOUT) == [2 * n for n in range(args.group_size)]
    mix.groups = time.perf_counter() - started
    started = time.perf_counter()
    chords = [
        chord((add.s(n, 1) for n in range(args.chord_size)), total.s()).delay()
        for _ in range(args.chords)
    ]
    expected = sum(n + 1 for n in range(args.chord_size))
    for result in chords:
        assert result.get(timeout=_GET_TIMEOUT) == expected, "a chord's answer is wrong"
    mix.chords = time.perf_counter() - started
    for _ in range(args.gets):
        started = time.perf_counter()
        noop.delay().get(timeout=_GET_TIMEOUT)
        mix.gets.append(time.perf_counter() - started)
    mix.tasks = (
        args.lone
        + 3 * args.chains
        + args.groups * args.group_size
        + args.chords * (args.chord_size + 1)
        + args.gets
    )
    return mix


def _settled(url: str) -> tuple[int, int]:
    """Runs not completed and steps not succeeded, once SQL stops changing or time is up."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    deadline = time.monotonic() + _SETTLE_TIMEOUT
    try:
        while True:
            with engine.connect() as conn:
                runs = conn.exec_driver_sql(
                    "SELECT count(*) FROM workflow_runs WHERE status <> 'completed'"
                ).scalar_one()
                steps = conn.exec_driver_sql(
                    "SELECT count(*) FROM workflow_step WHERE status <> 'succeeded'"
                ).scalar_one()
            if (runs == 0 and steps == 0) or time.monotonic() > deadline:
                return int(runs), int(steps)
            time.sleep(0.5)
    finally:
        engine.dispose()


def _deadlocks(paths: Sequence[Path], since: dict[Path, int]) -> int:
    count = 0
    for path in paths:
        if not path.exists():
            continue
        with path.open("rb") as text:
            text.seek(since.get(path, 0))
            count += sum(b"deadlock" in line for line in text)
    return count


def _node_logs(cluster: CitusCluster) -> list[Path]:
    version = cluster.postgres_version()
    return [Path(f"/var/log/postgresql/postgresql-{version}-{name}.log") for name in cluster.names]


def _one(cluster: CitusCluster, shards: int, args: argparse.Namespace, tmp: Path) -> None:
    name = f"pikku_citus_drive_{shards}"
    coordinator = cluster.url()
    drop_database(coordinator, name)
    url = create_database(coordinator, name)
    store = WorkflowStore(url)
    try:
        store.init()
        store.distribute(shard_count=shards)
    finally:
        store.close()
    flush(args.redis_url)
    logs = [tmp / f"worker{n}-{shards}.log" for n in range(args.flushers)]
    watched = _node_logs(cluster) + logs
    since = {path: path.stat().st_size for path in watched if path.exists()}
    with contextlib.ExitStack() as stack:
        for n, log in enumerate(logs):
            env = clean_env(
                {
                    BROKER_ENV: args.redis_url,
                    DATABASE_ENV: url,
                    JOURNAL_ENV: str(tmp / f"journal{n}-{shards}"),
                }
            )
            stack.enter_context(
                running_worker(
                    "bench.citus.app",
                    f"citus{n}",
                    ["-P", "prefork", "-c", str(args.concurrency)],
                    env,
                    args.redis_url,
                    log,
                )
            )
        app = build_app(args.redis_url, url, str(tmp / f"journal-driver-{shards}"))
        stack.callback(app.close)
        passes: list[Mix] = []
        started = time.perf_counter()
        while True:
            passes.append(_pass(app, args))
            if time.perf_counter() - started >= args.minutes * 60:
                break
        elapsed = time.perf_counter() - started
    open_runs, open_steps = _settled(url)
    deadlocks = _deadlocks(watched, since)
    gets = sorted(g for mix in passes for g in mix.gets)
    tasks = sum(mix.tasks for mix in passes)
    first = passes[0]
    print(
        f"| {shards} | {args.flushers} | {len(passes)} | {tasks:,} | {elapsed:.1f} | "
        f"{first.lone:.2f} | {first.chains:.2f} | {first.groups:.2f} | {first.chords:.2f} | "
        f"{statistics.median(gets) * 1000:.1f} | {gets[int(len(gets) * 0.99) - 1] * 1000:.1f} | "
        f"{open_runs} / {open_steps} | {deadlocks} |",
        flush=True,
    )
    if open_runs or open_steps:
        print(f"  {url}: {open_runs} runs not completed, {open_steps} steps not succeeded")
    if not args.keep:
        drop_database(coordinator, name)


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("shard counts, comma-separated: 4,32") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("shard counts of at least 1, comma-separated: 4,32")
    return counts


def drive(cluster: CitusCluster, argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.citus drive", description=__doc__)
    parser.add_argument("--shards", type=_counts, default=[4, 32], help="default 4,32")
    parser.add_argument("--flushers", type=int, default=1, help="worker nodes (default 1)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=0.0, help="repeat the mix this long")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--lone", type=int, default=200)
    parser.add_argument("--chains", type=int, default=20)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--chords", type=int, default=5)
    parser.add_argument("--chord-size", type=int, default=20)
    parser.add_argument("--gets", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    args = parser.parse_args(argv)
    print(
        "| shards | flushers | passes | tasks | s | lone s | chains s | groups s | chords s | "
        "get() p50 ms | p99 ms | open runs / steps | deadlock lines |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    # Each shard count in a process of its own: a process's mirror is set up once, for the
    # first app it installs, and would go on writing to that app's database.
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="citus-drive-") as folder:
        for shards in args.shards:
            one = spawn.Process(target=_one, args=(cluster, shards, args, Path(folder)))
            one.start()
            one.join()
            if one.exitcode:
                return one.exitcode
    return 0
