"""``runs show`` prints a run's own error whole, with its traceback, steps or none.

In process, on a real database (SQLite and PostgreSQL). A run fails with no step when
publishing its canvas failed (``PikkuCelery.run`` settles it with the exception), so the
error is stored as the store stores that one.
"""

from __future__ import annotations

import uuid

import pytest

from pikku_celery import WorkflowStore
from pikku_celery.cli import commands as cli
from pikku_celery.cli import common as codes
from tests.support import transitions

LONG = (
    "Error while publishing to redis://broker.internal:6379/0: the connection was refused "
    "after 3 attempts, so nothing of this canvas was sent;\n  check that the broker runs "
    "and that this host may reach it (the last attempt timed out after 4.0 s)"
)


def show(store: WorkflowStore, run_id: str, capsys: pytest.CaptureFixture[str]) -> str:
    url = store.engine.url.render_as_string(hide_password=False)
    assert cli.main(["runs", "show", run_id, "--database-url", url]) == codes.EXIT_OK
    return capsys.readouterr().out


def failed_to_publish(store: WorkflowStore) -> str:
    run_id = store.create_run("nightly", {"day": 1}, wire={"type": "canvas"})
    try:
        raise ConnectionRefusedError(LONG)
    except ConnectionRefusedError as exc:
        store.attempts.settle_run(run_id, "failed", exc)
    return run_id


def test_a_run_with_no_steps_shows_its_whole_error_and_traceback(
    store: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = failed_to_publish(store)
    text = show(store, run_id, capsys)
    whole = " ".join(LONG.split())
    [error_row] = [line for line in text.splitlines() if line.startswith("error ")]
    assert error_row.split(None, 1)[1] == f"ConnectionRefusedError: {whole}"
    assert "…" not in error_row
    errors = text.split("\n\nerrors\n")[1].splitlines()
    assert errors[0] == f"run: ConnectionRefusedError: {whole}"
    assert errors[1] == "    Traceback (most recent call last):"
    assert any(line.startswith("    ConnectionRefusedError: Error while") for line in errors)
    assert "\nsteps\n" not in text and "\nattempts (" not in text


def test_a_run_with_steps_shows_its_whole_error_too(
    store: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = store.create_run("checkout", {})
    step = str(uuid.uuid4())
    transitions.schedule(store, run_id, "charge", step_id=step, rpc_name="shop.charge", data={})
    store.attempts.record_attempt(step, 1, "running", task_id=step, worker="w@h", pid=7)
    store.attempts.record_attempt(step, 1, "failed", error={"type": "ValueError", "message": LONG})
    store.attempts.settle_run(
        run_id, "failed", {"type": "StepFailed", "message": f"charge: {LONG}"}
    )
    text = show(store, run_id, capsys)
    [error_row] = [line for line in text.splitlines() if line.startswith("error ")]
    assert error_row.endswith(" ".join(f"StepFailed: charge: {LONG}".split()))
    # No traceback of the run's own: the step's error, whole, is the one under "errors".
    errors = text.split("\n\nerrors\n")[1].splitlines()
    assert errors == [f"charge #1: ValueError: {' '.join(LONG.split())}"]


def test_a_run_without_an_error_shows_none(
    store: WorkflowStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = store.create_run("report", {})
    text = show(store, run_id, capsys)
    assert [line for line in text.splitlines() if line.startswith("error")] == ["error"]
    assert "\n\nerrors\n" not in text
