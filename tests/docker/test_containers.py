"""What only containers can show: real workers in the image, killed, cut off and doubled.

Each test runs on Redis and on RabbitMQ (pytest-celery's broker matrix), with a worker
container of ``dockerapp`` mirroring into the session's PostgreSQL container.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
from celery import chain, group
from pytest_celery import CeleryTestSetup  # type: ignore[import-untyped]

from pikku_celery import WorkflowStore
from pikku_celery.testing.docker import (
    JOURNAL_DIR,
    PikkuPostgres,
    PikkuWorkerContainer,
    PikkuWorkers,
    wait_for_run,
    wait_until,
)

CLI = str(Path(sys.executable).parent / "pikku-celery")


def history(store: WorkflowStore, run_id: str) -> list[tuple[str, int, str]]:
    return [(a.step_name, a.attempt, a.status) for a in store.get_run_history(run_id)]


def converged(store: WorkflowStore, run_id: str, expected: list[tuple[str, int, str]]) -> None:
    """Late events (a retry's end written after the next attempt's) converge: wait for them."""
    deadline = time.monotonic() + 20
    while (found := history(store, run_id)) != expected:
        if time.monotonic() > deadline:
            assert found == expected
        time.sleep(0.1)


def effects(postgres: PikkuPostgres, prefix: str) -> dict[str, int]:
    """How often each step really did its work, by label."""
    with psycopg.connect(postgres.url) as conn:
        rows = conn.execute(
            "SELECT label, count(*) FROM docker_effects WHERE label LIKE %s GROUP BY label",
            (f"{prefix}%",),
        ).fetchall()
    return {label: int(n) for label, n in rows}


def open_gate(postgres: PikkuPostgres, label: str) -> None:
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute("INSERT INTO docker_gates VALUES (%s)", (label,))


def first_worker(celery_setup: CeleryTestSetup) -> PikkuWorkerContainer:
    worker: PikkuWorkerContainer = celery_setup.worker.container
    return worker


def test_a_chain_with_a_retried_and_a_failing_step_is_read_back_with_the_cli(
    celery_setup: CeleryTestSetup,
    pikku_docker_app: ModuleType,
    pikku_docker_postgres: PikkuPostgres,
) -> None:
    app = pikku_docker_app
    order = uuid.uuid4().int % 10**9  # the session's database is shared by the tests
    run_id = app.pikku.run(
        chain(app.reserve.s(order), app.charge.s(2), app.refund.s()), name="refund-flow"
    )
    run = wait_for_run(app.pikku.store, run_id)
    assert run.status == "failed"
    converged(
        app.pikku.store,
        run_id,
        [
            ("reserve", 1, "succeeded"),
            ("charge", 1, "failed"),
            ("charge", 2, "failed"),
            ("charge", 3, "succeeded"),
            ("refund", 1, "failed"),
            ("refund", 2, "failed"),
        ],
    )
    shown = subprocess.run(
        [CLI, "runs", "show", run_id, "--json", "--database-url", pikku_docker_postgres.url],
        capture_output=True,
        text=True,
        check=True,
    )
    document = json.loads(shown.stdout)
    assert document["run"]["status"] == "failed"
    steps = {step["step_name"]: step for step in document["steps"]}
    charge = steps["charge"]["attempts"]
    assert [a["status"] for a in charge] == ["failed", "failed", "succeeded"]
    assert "gateway timeout (attempt 1)" in json.dumps(charge[0]["error"])
    refund = steps["refund"]["attempts"]
    assert f"order {order} cannot be refunded" in json.dumps(refund[-1]["error"])
    # Every attempt ran in the worker container, under its own host name.
    worker_host = f"pikku_worker@{first_worker(celery_setup).attrs['Config']['Hostname']}"
    assert {a["worker"] for s in document["steps"] for a in s["attempts"]} == {worker_host}
    listed = subprocess.run(
        [CLI, "runs", "list", "--json", "--database-url", pikku_docker_postgres.url],
        capture_output=True,
        text=True,
        check=True,
    )
    [listed_run] = [r for r in json.loads(listed.stdout)["runs"] if r["run_id"] == run_id]
    assert listed_run["status"] == "failed"
    assert effects(pikku_docker_postgres, f"charge-{order}") == {f"charge-{order}": 3}


def test_a_workflow_goes_on_in_a_new_container_after_its_worker_is_killed_mid_step(
    celery_setup: CeleryTestSetup,
    pikku_docker_app: ModuleType,
    pikku_docker_postgres: PikkuPostgres,
    pikku_docker_workers: PikkuWorkers,
) -> None:
    tag = f"kill-{uuid.uuid4().hex[:8]}"
    run_id = pikku_docker_app.durable.start(tag)
    wait_until(
        lambda: f"{tag}-middle-start" in effects(pikku_docker_postgres, tag), 30, "the middle step"
    )
    first_worker(celery_setup).kill()
    pikku_docker_workers.start()
    open_gate(pikku_docker_postgres, f"{tag}-middle")
    run = wait_for_run(pikku_docker_app.pikku.store, run_id, timeout=45)
    assert run.error is None
    assert (run.status, run.output) == (
        "completed",
        [len(f"{tag}-first"), len(f"{tag}-middle"), len(f"{tag}-last")],
    )
    # The steps that had finished ran once; the one cut off ran again, from the start.
    assert effects(pikku_docker_postgres, tag) == {
        f"{tag}-first": 1,
        f"{tag}-middle-start": 2,
        f"{tag}-middle": 1,
        f"{tag}-last": 1,
    }
    states = {s.step_name: s.status for s in pikku_docker_app.pikku.store.list_step_states(run_id)}
    assert states == {"first": "succeeded", "middle": "succeeded", "last": "succeeded"}


def ready_prompts(container: PikkuWorkerContainer) -> int:
    return str(container.logs()).count(str(container.ready_prompt))


def test_a_workflow_goes_on_when_its_broker_container_restarts_mid_step(
    celery_setup: CeleryTestSetup,
    pikku_docker_app: ModuleType,
    pikku_docker_postgres: PikkuPostgres,
) -> None:
    tag = f"restart-{uuid.uuid4().hex[:8]}"
    run_id = pikku_docker_app.durable.start(tag, acked_early=True)
    wait_until(
        lambda: f"{tag}-middle-start" in effects(pikku_docker_postgres, tag), 30, "the middle step"
    )
    broker = celery_setup.broker.container
    started = ready_prompts(broker)
    # A short grace: the broker is killed if it has not stopped by then, as a crashed one is.
    broker._container.restart(timeout=3)
    wait_until(lambda: ready_prompts(broker) > started, 60, "the broker back")
    open_gate(pikku_docker_postgres, f"{tag}-middle")
    run = wait_for_run(pikku_docker_app.pikku.store, run_id, timeout=60)
    assert run.error is None
    assert run.status == "completed"
    assert effects(pikku_docker_postgres, tag) == {
        f"{tag}-first": 1,
        f"{tag}-middle-start": 1,
        f"{tag}-middle": 1,
        f"{tag}-last": 1,
    }
    converged(
        pikku_docker_app.pikku.store,
        run_id,
        [("first", 1, "succeeded"), ("middle", 1, "succeeded"), ("last", 1, "succeeded")],
    )


def journal_bytes(worker: PikkuWorkerContainer) -> int:
    code, output = worker.exec_run(
        [
            "python",
            "-c",
            "import os, sys; print(sum(os.path.getsize(os.path.join(d, f)) "
            "for d, _, fs in os.walk(sys.argv[1]) for f in fs))",
            JOURNAL_DIR,
        ]
    )
    assert code == 0, output
    return int(output)


def test_a_paused_database_loses_nothing_and_the_journal_volume_outlives_its_container(
    celery_setup: CeleryTestSetup,
    pikku_docker_app: ModuleType,
    pikku_docker_postgres: PikkuPostgres,
    pikku_docker_workers: PikkuWorkers,
    docker_client: Any,
) -> None:
    """The database is away for 10 s while a worker runs every task of a run; that worker's
    container is removed before it could write a thing; the next one, on the same journal
    volume, writes it all."""
    first_worker(celery_setup).kill()  # the test's own workers take every task
    volume = docker_client.volumes.create(f"pikku-journal-{uuid.uuid4()}")
    try:
        worker = pikku_docker_workers.start(journal_volume=volume.name)
        tasks = 12
        # Published first: pikku.run() writes the run itself to SQL before it sends a task.
        run_id = pikku_docker_app.pikku.run(
            group(pikku_docker_app.slow_add.s(n, n) for n in range(tasks)), name="paused-database"
        )
        pikku_docker_postgres.container.pause()
        paused = time.monotonic()
        try:
            at_pause = journal_bytes(worker)
            wait_until(
                lambda: str(worker.logs()).count("succeeded in") == tasks, 30, "every task ran"
            )
            assert journal_bytes(worker) > at_pause  # the journal grows while the database is away
            pikku_docker_workers.remove(worker)  # with everything it journaled
            time.sleep(max(0.0, 10 - (time.monotonic() - paused)))
        finally:
            pikku_docker_postgres.container.unpause()
        pikku_docker_workers.start(journal_volume=volume.name)
        run = wait_for_run(pikku_docker_app.pikku.store, run_id, timeout=45)
        assert run.status == "completed"
        attempts = pikku_docker_app.pikku.store.get_run_history(run_id)
        assert len(attempts) == tasks
        assert {(a.attempt, a.status, a.delivery_count) for a in attempts} == {(1, "succeeded", 1)}
        assert sorted(a.result for a in attempts) == [2 * n for n in range(tasks)]
    finally:
        pikku_docker_workers.remove_all()
        volume.remove(force=True)


def test_two_worker_containers_on_one_store_make_no_duplicate_attempts(
    celery_setup: CeleryTestSetup,
    pikku_docker_app: ModuleType,
    pikku_docker_postgres: PikkuPostgres,
    pikku_docker_workers: PikkuWorkers,
) -> None:
    second = pikku_docker_workers.start()
    tasks = 16
    run_id = pikku_docker_app.pikku.run(
        group(pikku_docker_app.slow_add.s(n, 1) for n in range(tasks)), name="two-machines"
    )
    run = wait_for_run(pikku_docker_app.pikku.store, run_id, timeout=45)
    assert run.status == "completed"
    attempts = pikku_docker_app.pikku.store.get_run_history(run_id)
    assert len(attempts) == tasks
    assert {(a.attempt, a.status, a.delivery_count) for a in attempts} == {(1, "succeeded", 1)}
    steps = pikku_docker_app.pikku.store.list_step_states(run_id)
    # Named in the order they were published, whichever worker ran which.
    by_n = {s.data["args"][0]: s.step_name for s in steps}
    base = by_n[0]
    assert by_n == {n: base if n == 0 else f"{base}#{n + 1}" for n in range(tasks)}
    assert sorted(a.result for a in attempts) == [n + 1 for n in range(tasks)]
    hosts = {
        f"pikku_worker@{c.attrs['Config']['Hostname']}"
        for c in (first_worker(celery_setup), second)
    }
    # Prefetching one message per process, neither worker can hold all 16 tasks.
    assert {a.worker for a in attempts} == hosts
