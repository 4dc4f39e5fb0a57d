"""The one builder of a step's message options, shared by a replay's dispatch and the
reaper's resend."""

from __future__ import annotations

from pikku_celery.integration import headers as h


def test_a_workflow_steps_message_names_its_step_and_attempt_and_replays_its_run() -> None:
    options = h.step_message("run-1", "step-1", "charge#2", 3, orchestrated=True)
    assert options == {
        "task_id": "step-1",
        "retries": 2,  # the worker's request.retries + 1 is attempt 3
        "headers": {h.RUN_ID: "run-1", h.STEP_NAME: "charge#2", h.ORCHESTRATED: True},
    }


def test_a_lone_tasks_message_carries_no_replay_mark() -> None:
    options = h.step_message("run-1", "run-1", "shop.ship", 1, orchestrated=False)
    assert options["retries"] == 0
    assert options["headers"] == {h.RUN_ID: "run-1", h.STEP_NAME: "shop.ship"}
