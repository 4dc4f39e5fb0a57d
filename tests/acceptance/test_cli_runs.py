"""``pikku-celery runs``, ``prune`` and ``healthcheck`` as an operator runs them.

A real subprocess on a real database (SQLite and PostgreSQL); resume, rerun
and cancel publish through the users' app (``--app``) to a real worker. This
module starts its own worker, so it has no module-wide one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import WorkflowStore
from pikku_celery.cli import commands as cli_module
from pikku_celery.cli import common as codes
from pikku_celery.errors import RunFailed
from pikku_celery.store.prune import PruneCount
from tests.acceptance.conftest import ROOT, worker_running
from tests.conftest import PgServer
from tests.support import transitions
from tests.support.seed import add_runs

SHOP_APP = "tests.acceptance.shop:pikku"
MONTH = dt.timedelta(days=30)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pikku_celery", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, result.stdout
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    return result.stderr


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of the test's own, at the latest schema."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        server: PgServer = request.getfixturevalue("pg_server")
        url = server.create_database("pikku_cli_runs")
    store = WorkflowStore(url)
    store.init()
    store.close()
    return url


@pytest.fixture
def store(database_url: str) -> Iterator[WorkflowStore]:
    opened = WorkflowStore(database_url)
    yield opened
    opened.close()


def seed_failed_run(store: WorkflowStore) -> tuple[str, str]:
    """A checkout whose "charge" failed on its first attempt and on its retry, redelivered once."""
    run_id = store.create_run("checkout", {"order": 7})
    reserve, charge = str(uuid.uuid4()), str(uuid.uuid4())
    transitions.schedule(
        store, run_id, "reserve", step_id=reserve, rpc_name="shop.reserve", data={}
    )
    store.attempts.record_attempt(reserve, 1, "running", task_id=reserve, worker="w1@host", pid=41)
    store.attempts.record_attempt(reserve, 1, "succeeded", result={"reserved": True})
    transitions.schedule(
        store,
        run_id,
        "charge",
        step_id=charge,
        rpc_name="shop.charge",
        data={},
        parent_step_id=reserve,
    )
    store.attempts.record_attempt(charge, 1, "running", task_id=charge, worker="w1@host", pid=41)
    store.attempts.record_attempt(
        charge,
        1,
        "failed",
        error={"type": "ConnectionError", "message": "gateway timeout", "traceback": "Tb 1"},
    )
    store.attempts.record_attempt(charge, 2, "scheduled", task_id=charge, reason="retry")
    store.attempts.record_attempt(charge, 2, "running", task_id=charge, worker="w2@host", pid=52)
    store.attempts.record_attempt(charge, 2, "running", task_id=charge, worker="w2@host", pid=53)
    store.attempts.record_attempt(
        charge,
        2,
        "failed",
        error={"type": "ValueError", "message": "card declined " + "x" * 80, "traceback": "Tb"},
    )
    store.attempts.settle_run(run_id, "failed", {"type": "ValueError", "message": "card declined"})
    return run_id, charge


def test_runs_list_filters_limits_and_prints_json(database_url: str, store: WorkflowStore) -> None:
    failed, _ = seed_failed_run(store)
    report = store.create_run("report", {})
    db = ["--database-url", database_url]

    listing = ok(cli(*db, "runs", "list"))
    assert failed in listing and report in listing
    assert listing.splitlines()[0].split() == [
        "run",
        "workflow",
        "status",
        "created",
        "output",
        "/",
        "error",
    ]

    only_failed = json.loads(ok(cli(*db, "runs", "list", "--status", "failed", "--json")))
    assert [run["run_id"] for run in only_failed["runs"]] == [failed]
    assert only_failed["runs"][0]["error"]["message"] == "card declined"
    assert (only_failed["total"], only_failed["status"]) == (1, ["failed"])

    by_env = json.loads(
        ok(cli(*db, "runs", "list", env={"PIKKU_RUNS_WORKFLOW": "report", "PIKKU_JSON": "1"}))
    )
    assert [run["run_id"] for run in by_env["runs"]] == [report]

    first = ok(cli(*db, "runs", "list", "--limit", "1"))
    assert report in first and failed not in first  # newest first
    assert "1 of 2 runs" in first


def test_runs_show_prints_every_attempt_and_the_api_document(
    database_url: str, store: WorkflowStore
) -> None:
    run_id, charge = seed_failed_run(store)
    db = ["--database-url", database_url]

    text = ok(cli(*db, "runs", "show", run_id))
    assert f"run       {run_id}" in text
    assert "status    failed" in text
    rows = {
        (cols[0], cols[1]): cols
        for cols in (line.split() for line in text.split("attempts (")[1].splitlines()[3:])
        if cols and cols[0] in ("reserve", "charge")
    }
    assert rows[("charge", "2")][2:4] == ["failed", "retry"]
    assert {"w2@host", "53", "2"} <= set(rows[("charge", "2")])  # worker, pid, deliveries
    assert {"w1@host", "41", "1"} <= set(rows[("charge", "1")])
    assert "charge #1: ConnectionError: gateway timeout" in text
    assert "charge #2: ValueError: card declined " + "x" * 80 in text  # whole, under "errors"

    document = json.loads(ok(cli(*db, "runs", "show", run_id, "--json")))
    assert document["run"]["run_id"] == run_id
    [reserve_step, charge_step] = document["steps"]
    assert (reserve_step["step_name"], charge_step["step_name"]) == ("reserve", "charge")
    assert charge_step["step_id"] == charge
    second = charge_step["attempts"][1]
    assert (second["attempt"], second["status"], second["reason"]) == (2, "failed", "retry")
    assert (second["worker"], second["pid"], second["delivery_count"]) == ("w2@host", 53, 2)
    assert second["error"]["traceback"] == "Tb"
    assert second["running_at"] is not None and second["failed_at"] is not None

    assert "does not exist" in one_line_error(cli(*db, "runs", "show", "no-such-run"))


def test_runs_delete_removes_the_run_with_its_steps(
    database_url: str, store: WorkflowStore
) -> None:
    run_id, _ = seed_failed_run(store)
    kept = store.create_run("report", {})
    out = ok(cli("runs", "delete", run_id, env={"PIKKU_DATABASE_URL": database_url}))
    assert out.strip() == f"Deleted run {run_id} with its steps and attempts."
    assert store.list_step_states(run_id) == [] and store.get_run_history(run_id) == []
    assert [run.run_id for run in store.list_runs()] == [kept]
    again = cli("--database-url", database_url, "runs", "delete", run_id)
    assert "does not exist" in one_line_error(again)


def test_prune_counts_with_dry_run_then_deletes_in_batches(
    database_url: str, store: WorkflowStore
) -> None:
    add_runs(store, 1200, age=MONTH + dt.timedelta(days=1))
    unsettled = add_runs(store, 3, age=2 * MONTH, statuses=["running", "suspended"])
    recent = add_runs(store, 5, age=dt.timedelta(days=2))
    db = ["--database-url", database_url]

    dry = ok(cli(*db, "prune", "--older-than", "30d", "--dry-run"))
    assert dry.startswith("Would prune 1200 runs (1200 steps, 2400 attempts)")
    assert "Nothing was deleted" in dry
    assert store.count_runs() == 1208

    only_failed = ok(cli(*db, "prune", "--older-than", "720h", "--status", "failed", "--dry-run"))
    assert only_failed.startswith("Would prune 400 runs")

    done = cli(
        *db, "prune", env={"PIKKU_PRUNE_OLDER_THAN": "43200m", "PIKKU_PRUNE_BATCH_SIZE": "500"}
    )
    out = ok(done)
    assert out.startswith("Pruned 1200 runs (1200 steps, 2400 attempts)")
    assert "in 3 batches of at most 500 runs" in out
    # Not a terminal: one plain progress line per committed batch.
    assert done.stderr.splitlines() == [
        "500/1200 runs (42%)",
        "1000/1200 runs (83%)",
        "1200/1200 runs (100%)",
    ]
    assert {run.run_id for run in store.list_runs(limit=100)} == set(unsettled) | set(recent)
    again = ok(cli(*db, "prune", "--older-than", "30d"))
    assert again.startswith("Pruned 0 runs") and "in 0 batches" in again


def test_each_prune_batch_is_its_own_transaction(store: WorkflowStore) -> None:
    """1,200 old runs with batches of 500: three deletes, each committed before the next."""
    add_runs(store, 1200, age=2 * MONTH)
    before = dt.datetime.now(dt.timezone.utc) - MONTH
    events: list[str] = []

    def statement(conn: object, cursor: object, sql: str, *_: object) -> None:
        if sql.lstrip().upper().startswith("DELETE"):
            events.append("delete")

    def committed(conn: object) -> None:
        events.append("commit")

    left: list[int] = []
    sa.event.listen(store.engine, "before_cursor_execute", statement)
    sa.event.listen(store.engine, "commit", committed)
    try:
        total = store.prune(
            before, batch_size=500, on_batch=lambda _: left.append(store.count_runs())
        )
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", statement)
        sa.event.remove(store.engine, "commit", committed)
    assert total == PruneCount(runs=1200, steps=1200, attempts=2400)
    assert left == [700, 200, 0]  # the runs go 500 at a time, visible to other connections
    # Three batches, each its own transaction; then one that finds nothing and stops.
    assert events == ["delete", "commit"] * 3 + ["commit"]


def test_prune_refuses_bad_ages_and_unsettled_statuses(tmp_path: Path) -> None:
    db = ["--database-url", f"sqlite:///{tmp_path / 'x.db'}"]
    bad_age = one_line_error(cli(*db, "prune", "--older-than", "soon"), code=2)
    assert "use a number and a unit: 30d, 12h, 90m or 45s" in bad_age
    assert "--older-than" in one_line_error(cli(*db, "prune"), code=2)
    running = one_line_error(cli(*db, "prune", "--older-than", "1d", "--status", "running"))
    assert "'running' is not a prunable run status" in running


def test_healthcheck_exit_codes(tmp_path: Path, pg_server: PgServer) -> None:
    url = f"sqlite:///{tmp_path / 'health.db'}"
    missing = cli("--database-url", url, "healthcheck")
    assert "no pikku-celery database at" in one_line_error(missing)
    assert not (tmp_path / "health.db").exists()
    (tmp_path / "health.db").touch()  # an empty SQLite database: no schema yet
    behind = cli("--database-url", url, "healthcheck")
    assert behind.returncode == 3
    assert behind.stderr.count("\n") == 1 and "run `pikku-celery db upgrade`" in behind.stderr
    ok(cli("--database-url", url, "db", "upgrade"))
    assert ok(cli("--database-url", url, "healthcheck")).startswith("ok: sqlite:///")

    pg = pg_server.create_database("pikku_health")
    assert cli("--database-url", pg, "healthcheck").returncode == 3
    ok(cli("--database-url", pg, "db", "upgrade"))
    assert "schema is current" in ok(cli("healthcheck", env={"PIKKU_DATABASE_URL": pg}))

    down = cli("--database-url", "postgresql://ops:hunter2@127.0.0.1:1/none", "healthcheck")
    assert "cannot be reached" in one_line_error(down)
    assert "hunter2" not in down.stderr + down.stdout
    assert "Traceback" not in down.stderr


def test_help_names_the_environment_variable_of_every_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = {
        ("runs", "list"): [
            "PIKKU_RUNS_STATUS",
            "PIKKU_RUNS_WORKFLOW",
            "PIKKU_RUNS_LIMIT",
            "PIKKU_JSON",
        ],
        ("runs", "show"): ["PIKKU_JSON"],
        ("runs", "resume"): ["PIKKU_CELERY_APP"],
        ("runs", "rerun"): ["PIKKU_RERUN_FROM_STEP", "PIKKU_CELERY_APP"],
        ("runs", "cancel"): ["PIKKU_CELERY_APP"],
        ("dashboard",): ["PIKKU_CELERY_APP"],
        ("prune",): [
            "PIKKU_PRUNE_OLDER_THAN",
            "PIKKU_PRUNE_STATUS",
            "PIKKU_PRUNE_BATCH_SIZE",
            "PIKKU_PRUNE_DRY_RUN",
        ],
        (): ["PIKKU_DATABASE_URL", "PIKKU_CELERY_APP"],
    }
    for command, names in expected.items():
        with pytest.raises(SystemExit):
            cli_module.main([*command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for name in names:
            assert f"[env: {name}]" in text, (command, name)


def test_publishing_commands_without_an_app_say_to_pass_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", f"sqlite:///{tmp_path / 'x.db'}"]
    for command in (["resume", "r1"], ["rerun", "r1", "--from-step", "s"], ["cancel", "r1"]):
        assert cli_module.main([*db, "runs", *command]) == codes.EXIT_ERROR
        error = capsys.readouterr().err
        assert error.count("\n") == 1, error
        assert "pass --app module:attribute" in error and "PIKKU_CELERY_APP" in error
    wrong = one_line_error(cli(*db, "--app", "tests.acceptance.shop:app", "runs", "cancel", "r1"))
    assert "is a Celery, not a PikkuCelery" in wrong
    missing = one_line_error(cli(*db, "runs", "cancel", "r1", "--app", "no_such_module_here"))
    assert "cannot import 'no_such_module_here'" in missing


def test_resume_rerun_and_cancel_through_the_users_app(
    shop: ModuleType, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fix = tmp_path / "fixed"
    app = ["--app", SHOP_APP]  # the app's own database: SHOP_DATABASE_URL, as its workers use
    with worker_running(
        shop, "redis", tmp_path_factory.mktemp("cli"), extra_env={"SHOP_FIX_FILE": str(fix)}
    ) as worker:
        store = worker.store
        parked = shop.parked_flow.start()
        checkout = shop.checkout.start(7)
        fragile = shop.fragile_flow.start(3)

        # cancel: a run waiting on a step nobody will ever take.
        worker.wait_for_history(parked, [("first", 1, "succeeded"), ("park", 1, "scheduled")])
        cancelled = ok(cli("runs", "cancel", parked, env={"PIKKU_CELERY_APP": SHOP_APP}))
        assert cancelled.strip() == f"Cancelled run {parked}; revoked park."
        assert store.get_run(parked).status == "cancelled"
        assert store.get_step_state(parked, "park").status == "cancelled"
        again = ok(cli(*app, "runs", "cancel", parked))
        assert again.strip() == f"Run {parked} is cancelled already; nothing to cancel."

        # rerun: a completed run does its last step again, as a new attempt.
        first = shop.pikku.wait(checkout, timeout=45)
        rerun = ok(cli("runs", "rerun", checkout, "--from-step", "ship", *app))
        assert rerun.strip() == f"Rerunning run {checkout} from ship: new attempts for ship."
        worker.wait_for_run(checkout)
        assert shop.pikku.wait(checkout, timeout=45) == first
        ships = [a for a in store.get_run_history(checkout) if a.step_name == "ship"]
        assert [(a.attempt, a.status, a.reason) for a in ships] == [
            (1, "succeeded", "first"),
            (2, "succeeded", "rerun"),
        ]
        wrong_step = one_line_error(cli(*app, "runs", "rerun", checkout, "--from-step", "nope"))
        assert "has no step 'nope'; its steps are reserve, charge, token, ship" in wrong_step

        # resume: after the fix is deployed, only the failed step runs again.
        with pytest.raises(RunFailed):
            shop.pikku.wait(fragile, timeout=45)
        fix.write_text("deployed")
        resumed = ok(cli(*app, "runs", "resume", fragile))
        assert resumed.strip() == f"Resumed run {fragile}: new attempts for fragile."
        assert shop.pikku.wait(fragile, timeout=45) == [6, "fixed 3"]
        db = store.engine.url.render_as_string(hide_password=False)
        shown = json.loads(ok(cli("--database-url", db, "runs", "show", fragile, "--json")))
        fragile_step = next(s for s in shown["steps"] if s["step_name"] == "fragile")
        assert [a["reason"] for a in fragile_step["attempts"]] == ["first", "resume"]


def test_dashboard_with_app_wires_the_run_actions(
    shop: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    from pikku_celery import dashboard

    made: dict[str, Any] = {}
    real_create_app = dashboard.create_app

    def create_app(store: WorkflowStore, **options: Any) -> Any:
        made.update(store=store, **options)
        return real_create_app(store, **options)

    monkeypatch.setattr(dashboard, "create_app", create_app)
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets=None: None)
    monkeypatch.setenv("PIKKU_DASHBOARD_PASSWORD", "pw")
    assert cli_module.main(["dashboard", "--app", SHOP_APP, "--port", "0"]) == codes.EXIT_OK
    assert made["actions"] is shop.pikku
    assert made["store"] is shop.pikku.store  # the app's own database
    assert "sign in to resume, rerun, cancel and delete runs" in capsys.readouterr().out
