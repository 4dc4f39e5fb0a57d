"""PostgreSQL cut off from a real worker while 500 tasks run: nothing fails, nothing is lost.

The worker reaches the database through a proxy the test owns; cutting the
proxy is the network going away (connections reset, new ones refused). The
shared PostgreSQL server itself never stops.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from tests.acceptance.conftest import wait_until, worker_running
from tests.support.tcp_proxy import TcpProxy

TASKS = 500
OUTAGE_SECONDS = 6.0


@contextmanager
def proxied_database(pg_url: str, tmp: Path) -> Iterator[tuple[TcpProxy, dict[str, str]]]:
    """A proxy to the session's database, and a worker environment that goes through it."""
    target = sa.make_url(pg_url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        proxied = target.set(port=proxy.port).render_as_string(hide_password=False)
        yield proxy, {"SHOP_DATABASE_URL": proxied, "PIKKU_JOURNAL_DIR": str(tmp / "spool")}


def test_a_database_outage_mid_run_fails_no_task_and_loses_no_transition(
    shop: ModuleType, pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("db-outage")
    store: WorkflowStore = shop.pikku.store
    with proxied_database(pg_url, tmp) as (proxy, env):
        with worker_running(shop, "redis", tmp, extra_env=env) as worker:
            ids = {shop.outage_step.delay(n).id: n for n in range(TASKS)}
            wait_until(lambda: len(worker.journal_lines()) >= 60, what="the first tasks")
            proxy.cut()
            cut_at_line = len(worker.journal_lines())
            time.sleep(OUTAGE_SECONDS)
            during = len(worker.journal_lines()) - cut_at_line
            proxy.restore()
            restored = time.monotonic()
            for task_id in ids:
                worker.wait_for_run(task_id, timeout=120)
            recovered = time.monotonic() - restored
            log = worker.log.read_text()

    # The tasks' own record of what ran: "outage_step <n> attempt <k>".
    ran = Counter(
        (int(n), int(k))
        for n, k in re.findall(
            r"outage_step (\d+) attempt (\d+)", "\n".join(worker.journal_lines())
        )
    )
    assert during > 0, "no task ran while the database was away; the outage proved nothing"
    assert set(ran.values()) == {1}, "a task ran twice"
    found = expected = 0
    for task_id, n in ids.items():
        attempts = 2 if n % 5 == 0 else 1
        assert sorted(k for m, k in ran if m == n) == list(range(1, attempts + 1))
        run = store.get_run(task_id)
        assert (run.status, run.output) == ("completed", n), run
        history = store.get_run_history(task_id)
        want = [("outage_step", k, "failed") for k in range(1, attempts)] + [
            ("outage_step", attempts, "succeeded")
        ]
        assert [(a.step_name, a.attempt, a.status) for a in history] == want
        for attempt in history:
            # Every transition left its mark: scheduled, running, then the outcome.
            assert attempt.scheduled_at is not None and attempt.running_at is not None
            assert (attempt.succeeded_at or attempt.failed_at) is not None
            assert attempt.delivery_count == 1  # recorded once, never doubled
        expected += 3 * attempts  # scheduled, running and the outcome of each attempt
        found += sum(
            (a.scheduled_at is not None)
            + (a.running_at is not None)
            + ((a.succeeded_at or a.failed_at) is not None)
            for a in history
        )
    assert found == expected
    assert "mirror_spooling" in log or "keeping mirror events" in log
    assert "caught up" in log
    assert "raised unexpected" not in log  # no task failed because of the mirror
    assert not list(Path(tmp / "spool").glob("*/*.journal")), "a journal was left behind"
    print(
        f"\n{TASKS} tasks, {OUTAGE_SECONDS}s outage: {during} task executions during it; "
        f"transitions expected {expected}, found {found}; duplicates 0; "
        f"every run settled {recovered:.1f}s after the database came back"
    )


def test_a_worker_killed_with_events_in_its_spool_leaves_them_to_the_next_worker(
    shop: ModuleType, pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("spool-restart")
    store: WorkflowStore = shop.pikku.store
    with proxied_database(pg_url, tmp) as (proxy, env):
        ids = [shop.outage_step.delay(n).id for n in (1, 2, 3, 5)]  # 5 retries once
        proxy.cut()
        with worker_running(shop, "redis", tmp, extra_env=env) as first:
            wait_until(lambda: len(first.journal_lines()) >= 5, what="the tasks to run")
            time.sleep(0.5)
            first.kill_all()  # SIGKILL: the journals stay on disk, nothing wrote them
        spools = list((tmp / "spool").glob("*/*.journal"))
        assert spools, "the events should wait in a journal"
        assert all(store.get_run(task_id).status == "running" for task_id in ids)
        proxy.restore()
        started = time.monotonic()
        with worker_running(shop, "redis", tmp, extra_env=env) as second:
            for task_id in ids:
                run = second.wait_for_run(task_id, timeout=60)
                assert run.status == "completed"
            took = time.monotonic() - started
            log = second.log.read_text()
    assert "left in" in log  # the new worker adopted the journals
    assert [(a.attempt, a.status) for a in store.get_run_history(ids[-1])] == [
        (1, "failed"),
        (2, "succeeded"),
    ]
    assert len(worker_journal := first.journal_lines()) == 5, worker_journal  # nothing re-ran
    assert not list((tmp / "spool").glob("*/*.journal"))
    print(f"\nspooled events of a killed worker written {took:.1f}s after the next one started")
