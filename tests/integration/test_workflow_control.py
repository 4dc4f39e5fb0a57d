"""resume, rerun and cancel refuse what they cannot do, with errors that say what to do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from pikku_celery import PikkuCelery, RunNotFound, StepNotFound, WorkflowStore
from pikku_celery.errors import NotAWorkflowRun
from tests.support import transitions


@pytest.fixture
def pikku(store: WorkflowStore) -> Iterator[PikkuCelery]:
    app = Celery("control", broker="memory://", set_as_current=False)
    pikku = PikkuCelery(app, store=store)
    yield pikku
    pikku.uninstall()


def test_resume_and_rerun_of_a_canvas_run_are_refused(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    run_id = store.create_run("checkout", {}, wire={"type": "canvas"})
    transitions.schedule(store, run_id, "charge", rpc_name="shop.charge")
    with pytest.raises(NotAWorkflowRun, match="publish the task or canvas again"):
        pikku.resume(run_id)
    with pytest.raises(NotAWorkflowRun):
        pikku.rerun(run_id, from_step="charge")
    assert store.get_step_state(run_id, "charge").attempt_count == 1


def test_rerun_from_an_unknown_step_names_the_steps_there_are(
    pikku: PikkuCelery, store: WorkflowStore
) -> None:
    run_id = store.create_run("flow", {}, wire={"type": "workflow"})
    transitions.schedule(store, run_id, "reserve")
    transitions.schedule(store, run_id, "charge")
    with pytest.raises(StepNotFound, match="the run's steps are reserve, charge"):
        pikku.rerun(run_id, from_step="ship")


def test_cancel_of_an_unknown_run_is_an_error(pikku: PikkuCelery) -> None:
    with pytest.raises(RunNotFound):
        pikku.cancel("no-such-run")
