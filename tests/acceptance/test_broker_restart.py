"""Redis restarted mid-run: the worker reconnects, runs finish, no attempt is doubled.

The broker is a private redis-server that keeps nothing on disk: a message still
queued when it stops is gone with it (that is Redis, not the mirror), and so is
the record of messages being worked on, so nothing is redelivered either. The
first wave is therefore consumed before the restart, and the restart hits two
running tasks: one ends while the broker is away, the other once it is back and
then publishes a retry and its chain's next link to the restarted broker.

When only the connections drop and Redis keeps its data, Celery puts the messages
of running ``acks_late`` tasks back and runs them a second time: the mirror shows
that as more deliveries of the same attempts, never as new attempts.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis
from celery import chain

from pikku_celery import WorkflowStore
from tests.acceptance.conftest import (
    BROKERS,
    MIRROR_TROUBLE,
    QUEUE,
    Worker,
    wait_until,
    worker_running,
)
from tests.support.redis_server import RedisServer

logger = logging.getLogger(__name__)

History = list[tuple[str, int, str]]

# Seconds the broker is away: a quick restart. Celery's consumer retries its connection
# 2 s after the loss, then 4 s after that, and so on; this outage ends before the first retry.
DOWN_FOR = 1.2
# Both in-flight tasks have started a moment before the broker stops.
ENDS_WHILE_DOWN = 0.6
ENDS_WHEN_BACK = DOWN_FOR + 2.0
# The first retry succeeds, or the worker would sit out four more seconds.
RECOVERY_BOUND = 5.0

PLAIN: History = [("tick", 1, "succeeded")]
RETRIED: History = [("wobbly", 1, "failed"), ("wobbly", 2, "failed"), ("wobbly", 3, "succeeded")]
CHAIN: History = [
    ("tick", 1, "succeeded"),
    ("wobbly", 1, "failed"),
    ("wobbly", 2, "succeeded"),
    ("tick#2", 1, "succeeded"),
]
IN_FLIGHT_CHAIN: History = [
    ("tick", 1, "succeeded"),
    ("linger", 1, "failed"),
    ("linger", 2, "succeeded"),
    ("tick#2", 1, "succeeded"),
]
IN_FLIGHT_LONE: History = [("linger", 1, "succeeded")]


def publish_wave(shop: ModuleType, tag: str) -> dict[str, History]:
    """Plain steps, retried steps and 3-task chains: run id -> the history it must end with."""
    runs = {shop.tick.delay(f"{tag}-{n}").id: PLAIN for n in range(8)}
    runs |= {shop.wobbly.delay(f"{tag}-{n}", 2).id: RETRIED for n in range(4)}
    for n in range(3):
        canvas = chain(shop.tick.s(f"{tag}-{n}"), shop.wobbly.s(1), shop.tick.s())
        runs[shop.pikku.run(canvas, name=f"restart-{tag}")] = CHAIN
    return runs


def settle(worker: Worker, runs: dict[str, History], timeout: float = 60) -> None:
    for run_id, expected in runs.items():
        run = worker.wait_for_run(run_id, timeout=timeout)
        assert run.status == "completed", (run_id, run.status, run.error)
        worker.wait_for_history(run_id, expected)


def executions(worker: Worker) -> Counter[tuple[str, int]]:
    """(task id, attempt) -> how often the task body really ran, from the tasks' own journal."""
    ran: Counter[tuple[str, int]] = Counter()
    for line in worker.journal_lines():
        _name, task_id, attempt = line.split()
        ran[(task_id, int(attempt))] += 1
    return ran


def mirrored_deliveries(store: WorkflowStore, run_ids: Iterable[str]) -> Counter[tuple[str, int]]:
    """(task id, attempt) -> the attempt's delivery count, checking attempts are 1..n per step."""
    deliveries: Counter[tuple[str, int]] = Counter()
    for run_id in run_ids:
        attempts: dict[str, list[int]] = {}
        for attempt in store.get_run_history(run_id):
            attempts.setdefault(attempt.step_id, []).append(attempt.attempt)
            assert attempt.task_id is not None
            key = (attempt.task_id, attempt.attempt)
            assert key not in deliveries, f"attempt {key} of run {run_id} is mirrored twice"
            deliveries[key] = attempt.delivery_count
        for step_id, numbers in attempts.items():
            assert sorted(numbers) == list(range(1, len(numbers) + 1)), (run_id, step_id, numbers)
    return deliveries


def connects(worker: Worker) -> int:
    return worker.log.read_text().count("Connected to redis://")


def quiet(client: redis.Redis) -> bool:
    """Nothing queued and nothing delivered but unacknowledged, twice, half a second apart.

    Then every delivery, repeated ones included, has run and been mirrored (all the shop's
    tasks ack late). Twice, because a message just fetched is in neither place for a moment.
    """

    def idle() -> bool:
        return client.llen(QUEUE) == 0 and client.hlen("unacked") == 0

    if not idle():
        return False
    time.sleep(0.5)
    return idle()


def start_in_flight(shop: ModuleType, worker: Worker, lone: float, linked: float) -> list[str]:
    """A lone task and a chain whose middle link retries once it wakes, both running now.

    One pool process each, and nothing left queued for a broker fault to lose.
    """
    lone_run = shop.linger.delay("lone", lone).id
    chain_run = shop.pikku.run(
        chain(shop.tick.s("flight"), shop.linger.s(linked, 1), shop.tick.s()),
        name="in-flight",
    )
    wait_until(
        lambda: sum(line.startswith("shop.linger") for line in worker.journal_lines()) == 2,
        what="both lingering tasks running",
    )
    return [lone_run, chain_run]


def assert_mirror_matches_journal(
    worker: Worker, run_ids: Iterable[str]
) -> Counter[tuple[str, int]]:
    ran = executions(worker)
    mirrored = mirrored_deliveries(worker.store, run_ids)
    assert mirrored == ran, "the mirror's delivery counts differ from what really ran"
    # The database never went away: no mirror write may have been dropped or put off.
    log = worker.log.read_text()
    for trouble in MIRROR_TROUBLE:
        assert trouble not in log, trouble
    return ran


@pytest.fixture
def broker(shop: ModuleType) -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server
    # Later tests publish without starting a worker: not to a broker that is gone.
    shop.app.conf.broker_url = BROKERS["redis"][0]
    shop.app._after_fork()


def test_a_redis_restart_mid_run_loses_no_run_and_doubles_no_attempt(
    shop: ModuleType,
    broker: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Redis away for 1.2 s under a prefork worker (-c 2) with two tasks in flight.

    Every run of both waves completes with exactly its expected attempts, every attempt
    ran once and is mirrored once with a delivery count of 1, and the worker consumes
    again within 5 s of the restart (Celery's first reconnect, 2 s after the loss).
    """
    tmp: Path = tmp_path_factory.mktemp("broker-restart")
    with worker_running(shop, "redis", tmp, concurrency=2, broker_url=broker.url) as worker:
        first = publish_wave(shop, "first")
        settle(worker, first)

        # The chain's retry and last link are published after the restart.
        in_flight_lone, in_flight_chain = start_in_flight(
            shop, worker, ENDS_WHILE_DOWN, ENDS_WHEN_BACK
        )
        first |= {in_flight_chain: IN_FLIGHT_CHAIN, in_flight_lone: IN_FLIGHT_LONE}
        queued = redis.Redis.from_url(broker.url).llen(QUEUE)
        assert queued == 0, f"{queued} messages still queued: a restart would lose them"
        assert connects(worker) == 1

        restarted = time.monotonic()
        down_at = dt.datetime.now(dt.timezone.utc)
        broker.restart(down_for=DOWN_FOR)
        up_at = dt.datetime.now(dt.timezone.utc)
        # Published at once: they wait in the restarted broker for the worker to come back.
        probe = shop.tick.delay("probe").id
        second = publish_wave(shop, "second")

        wait_until(lambda: connects(worker) >= 2, timeout=30, what="a reconnect")
        reconnected = time.monotonic() - restarted
        wait_until(
            lambda: worker.store.get_run(probe).status == "completed",
            timeout=30,
            what="the first task after the restart",
        )
        recovered = time.monotonic() - restarted
        assert recovered < RECOVERY_BOUND, (
            f"Redis away {DOWN_FOR} s: the first task after the restart succeeded only "
            f"{recovered:.1f} s after it began (reconnected after {reconnected:.1f} s); "
            f"expected under {RECOVERY_BOUND} s"
        )
        second[probe] = PLAIN

        settle(worker, second)
        settle(worker, first)

        [lone] = worker.store.get_run_history(in_flight_lone)
        assert lone.succeeded_at is not None and down_at < lone.succeeded_at < up_at, (
            "the lone task was meant to end while the broker was away"
        )
        woke = [a for a in worker.store.get_run_history(in_flight_chain) if a.step_name == "linger"]
        assert woke[0].failed_at is not None and woke[0].failed_at > up_at, (
            "the chain's lingering link was meant to retry once the broker was back"
        )
        ran = assert_mirror_matches_journal(worker, [*first, *second])
        assert set(ran.values()) == {1}, "an attempt ran twice"
        logger.info(
            "Redis away %.1f s: reconnected after %.1f s, first new task succeeded after %.1f s; "
            "%d runs, %d executions, none doubled",
            DOWN_FOR,
            reconnected,
            recovered,
            len(first) + len(second),
            sum(ran.values()),
        )


def test_dropped_broker_connections_redeliver_a_running_task_into_the_same_attempts(
    shop: ModuleType,
    broker: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Every client of a Redis that keeps its data is disconnected while a step runs.

    The step is a chain's middle link that retries once. Celery delivers its running
    message again (at least once, as documented) to the idle pool process, so the step's
    first attempt runs twice and so does all that follows it. The run completes with
    exactly its expected attempts; each extra execution is one more delivery of the
    attempt it repeats (attempt 1: 2 deliveries), and every delivery is one the tasks ran.
    """
    tmp: Path = tmp_path_factory.mktemp("broker-drop")
    with worker_running(shop, "redis", tmp, concurrency=2, broker_url=broker.url) as worker:
        # One pool process stays idle, so the consumer is waiting on the broker and sees
        # the connection go at once.
        run_id = shop.pikku.run(
            chain(shop.tick.s("flight"), shop.linger.s(2.0, 1), shop.tick.s()), name="drop"
        )
        wait_until(
            lambda: any(line.startswith("shop.linger") for line in worker.journal_lines()),
            what="the lingering link running",
        )
        client = redis.Redis.from_url(broker.url)
        dropped = client.client_kill_filter(_type="normal", skipme=True)
        after = publish_wave(shop, "after-drop")
        wait_until(lambda: quiet(client), timeout=60, what="nothing queued or running")
        settle(worker, {run_id: IN_FLIGHT_CHAIN, **after})

        ran = assert_mirror_matches_journal(worker, [run_id, *after])
        [first] = [
            a
            for a in worker.store.get_run_history(run_id)
            if (a.step_name, a.attempt) == ("linger", 1)
        ]
        assert first.delivery_count == 2, "the running message was not delivered again"
        logger.info(
            "%d client connections dropped; executions per repeated attempt: %s",
            dropped,
            sorted(n for n in ran.values() if n > 1),
        )
