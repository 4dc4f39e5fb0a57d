"""Soak: ten thousand tasks, one in ten retried, through one prefork worker (-c 2).

Database connections stay flat, the worker's memory does not keep growing, and
the mirror holds exactly one completed run and one succeeded step per task.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from tests.acceptance.conftest import MIRROR_TROUBLE, children_pids, worker_running

logger = logging.getLogger(__name__)

TASKS = 10_000
RETRY_EVERY = 10  # every tenth task fails its first attempt and retries at once
WARM_UP = 1_000  # tasks done before connections and memory are taken as the baseline
CONCURRENCY = 2
DEADLINE = 220.0  # seconds from the worker's start to the last task, publishing included
# A pool process uses one connection at a time (one mirror write after another), so it
# keeps one, however many its engine's pool would allow (5 + 10 overflow). The main
# process has two threads that write: its flusher and the workers' reaper (recovery at
# start, a reaper pass every interval), so it keeps up to two.
WORKER_CONNECTIONS = 2 + CONCURRENCY
# RSS at the end over RSS after the warm-up. The main process runs no mirror writes.
MAIN_RSS_GROWTH = 1.1
# A pool process: Celery itself (a plain Celery app, without pikku-celery) grows a pool
# process by some 80-180 MB over the first few hundred to thousand exceptions its tasks
# raise (a retry raises one), then levels off. The 500 or so retries each process sees
# here take it to about 1.8x; steps that do not raise add nothing (flat over 2,000 per
# process), so a leak of 10 KiB per task would still break this bound.
POOL_RSS_GROWTH = 2.5


@dataclass
class Sample:
    seconds: float
    done: int
    connections: int
    rss_kib: dict[int, int]


@dataclass
class Sampler:
    """Once a second: tasks done, connections to the session's database, RSS per process."""

    engine: sa.Engine
    database: str
    pids: list[int]
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self, conn: sa.Connection, started: float) -> Sample:
        connections = conn.execute(
            sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db"),
            {"db": self.database},
        ).scalar_one()
        done = conn.execute(
            sa.text(
                "SELECT count(*) FROM workflow_step"
                " WHERE rpc_name = 'shop.soak' AND status = 'succeeded'"
            )
        ).scalar_one()
        taken = Sample(time.monotonic() - started, int(done), int(connections), rss_of(self.pids))
        self.samples.append(taken)
        return taken

    def run(self, started: float) -> None:
        with self.engine.connect() as conn:
            while not self._stop.wait(1.0):
                self.sample(conn, started)
                conn.rollback()  # a fresh snapshot for the next count

    @property
    def last(self) -> Sample:
        return self.samples[-1]

    def warm(self) -> Sample:
        return next(s for s in self.samples if s.done >= WARM_UP)

    def stop(self) -> None:
        self._stop.set()


def rss_of(pids: list[int]) -> dict[int, int]:
    sizes: dict[int, int] = {}
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes[pid] = int(line.split()[1])
    return sizes


@pytest.fixture
def watcher_engine(shop: ModuleType) -> Iterator[sa.Engine]:
    # One connection of its own for the whole test, so it counts as a constant.
    engine = sa.create_engine(shop.pikku.store.engine.url, poolclass=sa.pool.StaticPool)
    yield engine
    engine.dispose()


def connections_now(engine: sa.Engine, database: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db"),
                {"db": database},
            ).scalar_one()
        )


def test_ten_thousand_tasks_keep_connections_and_memory_flat(
    shop: ModuleType, watcher_engine: sa.Engine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """10,000 tasks (1,000 retried once) in under 220 s on two cores.

    Connections to the session's database never exceed what the session already held plus
    one per worker process and one for the publisher, and do not grow after the first 1,000
    tasks; RSS at the end is at most 1.1x (main process) and 2.5x (pool processes) of what
    it was after those 1,000; the mirror holds exactly 10,000 completed runs and 10,000
    succeeded steps, 1,000 of them on their second attempt, each attempt delivered once.
    """
    database = shop.pikku.store.engine.url.database
    assert database
    before = connections_now(watcher_engine, database)  # the session's own, the watcher's
    with worker_running(
        shop, "redis", tmp_path_factory.mktemp("soak"), concurrency=CONCURRENCY
    ) as worker:
        started = time.monotonic()
        pool = children_pids(worker.proc.pid)
        assert len(pool) == CONCURRENCY
        sampler = Sampler(watcher_engine, database, [worker.proc.pid, *pool])
        thread = threading.Thread(target=sampler.run, args=(started,), daemon=True)
        thread.start()
        try:
            published = time.monotonic()
            retried: set[str] = set()
            ids: list[str] = []
            with shop.app.producer_or_acquire() as producer:
                for n in range(TASKS):
                    retry = n % RETRY_EVERY == 0
                    task_id = shop.soak.apply_async((retry,), producer=producer).id
                    ids.append(task_id)
                    if retry:
                        retried.add(task_id)
            publish_seconds = time.monotonic() - published
            while not sampler.samples or sampler.last.done < TASKS:
                assert time.monotonic() - started < DEADLINE, (
                    f"{sampler.last.done if sampler.samples else 0} of {TASKS} tasks done "
                    f"after {DEADLINE:.0f} s; worker log:\n{worker.log.read_text()[-3000:]}"
                )
                time.sleep(0.5)
            drained = time.monotonic() - published
        finally:
            sampler.stop()
            thread.join(timeout=10)
        assert children_pids(worker.proc.pid) == pool, "a pool process was replaced"
        log = worker.log.read_text()

    samples = sampler.samples
    first, warm, end = samples[0], sampler.warm(), samples[-1]
    connections = [s.connections for s in samples]
    logger.info(
        "%d tasks: published in %.1f s (%.0f/s), all done %.1f s after the first publish "
        "(%.0f tasks/s); connections before %d, min %d, max %d, after warm-up %d, end %d; "
        "RSS KiB (first sample, after warm-up, end) %s",
        TASKS,
        publish_seconds,
        TASKS / publish_seconds,
        drained,
        TASKS / drained,
        before,
        min(connections),
        max(connections),
        warm.connections,
        end.connections,
        {pid: (first.rss_kib[pid], warm.rss_kib[pid], end.rss_kib[pid]) for pid in end.rss_kib},
    )
    bound = before + WORKER_CONNECTIONS + 1
    assert max(connections) <= bound, (
        f"up to {max(connections)} connections to the mirror's database; at most {bound} "
        f"({before} before the worker, one per pool process and two for the main one, "
        "one for the publisher)"
    )
    later = max(s.connections for s in samples if s.done >= WARM_UP)
    # The main process's second writer (the reaper's pass every 10 s) may connect after
    # the warm-up, once; anything more would grow with the tasks.
    assert later <= warm.connections + 1, (
        f"connections grew from {warm.connections} after {WARM_UP} tasks to {later}"
    )
    for pid, size in end.rss_kib.items():
        allowed = MAIN_RSS_GROWTH if pid == worker.proc.pid else POOL_RSS_GROWTH
        assert size <= allowed * warm.rss_kib[pid], (
            f"worker process {pid} grew from {warm.rss_kib[pid]} KiB after {WARM_UP} tasks "
            f"to {size} KiB after {TASKS} (allowed: {allowed}x)"
        )
    for trouble in MIRROR_TROUBLE:
        assert trouble not in log, trouble

    with watcher_engine.connect() as conn:
        params = {"ids": ids}
        runs = conn.execute(
            sa.text(
                "SELECT status, count(*) FROM workflow_runs"
                " WHERE workflow_run_id = ANY(:ids) GROUP BY status"
            ),
            params,
        ).all()
        steps = conn.execute(
            sa.text(
                "SELECT status, current_attempt, count(*) FROM workflow_step"
                " WHERE workflow_run_id = ANY(:ids) GROUP BY status, current_attempt"
            ),
            params,
        ).all()
        attempts = conn.execute(
            sa.text(
                "SELECT h.attempt, h.status, h.delivery_count, count(*)"
                " FROM workflow_step_history h JOIN workflow_step s USING (workflow_step_id)"
                " WHERE s.workflow_run_id = ANY(:ids)"
                " GROUP BY h.attempt, h.status, h.delivery_count"
            ),
            params,
        ).all()
        second_attempts = set(
            conn.execute(
                sa.text(
                    "SELECT workflow_run_id FROM workflow_step"
                    " WHERE workflow_run_id = ANY(:ids) AND current_attempt = 2"
                ),
                params,
            ).scalars()
        )
    once = TASKS // RETRY_EVERY
    assert dict((status, n) for status, n in runs) == {"completed": TASKS}
    assert {(status, attempt): n for status, attempt, n in steps} == {
        ("succeeded", 1): TASKS - once,
        ("succeeded", 2): once,
    }
    assert {(attempt, status, deliveries): n for attempt, status, deliveries, n in attempts} == {
        (1, "succeeded", 1): TASKS - once,
        (1, "failed", 1): once,
        (2, "succeeded", 1): once,
    }
    assert second_attempts == retried
