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


class _Request:
    """A request as Celery makes one: a message's headers become its attributes."""

    def __init__(self, **attributes: object) -> None:
        self.__dict__.update(attributes)


class _Slotted:
    """A request with no ``__dict__``: its headers are read one by one."""

    __slots__ = ("headers", "id")

    def __init__(self, headers: dict[str, object]) -> None:
        self.id = "s-1"
        self.headers = headers


def test_fields_of_reads_what_from_request_reads_in_one_pass() -> None:
    request = _Request(
        id="t-1",
        headers={h.STEP_NAME: "from-headers", h.ORCHESTRATED: True},
        **{h.RUN_ID: "run-1", h.SENT_AT: 12.5, h.PARENT_STEP: None},
    )
    fields = h.fields_of(request)
    # An attribute wins over request.headers; a header only in request.headers counts.
    assert fields == {
        h.RUN_ID: "run-1",
        h.SENT_AT: 12.5,
        h.STEP_NAME: "from-headers",
        h.ORCHESTRATED: True,
    }
    for name in (h.RUN_ID, h.STEP_NAME, h.PARENT_STEP, h.ORCHESTRATED, h.REPLACES, h.SENT_AT):
        assert fields.get(name) == h.from_request(request, name)


def test_fields_of_a_request_without_a_dict() -> None:
    request = _Slotted({h.RUN_ID: "run-2", h.REPLACES: ["s-1", 2]})
    assert h.fields_of(request) == {h.RUN_ID: "run-2", h.REPLACES: ["s-1", 2]}
    assert h.fields_of(_Slotted({})) == {}
