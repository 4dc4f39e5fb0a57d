from __future__ import annotations

import json

import pytest

from pikku_celery.mirror.events import (
    Adoption,
    AttemptEnded,
    AttemptReplaced,
    AttemptRetried,
    AttemptStarted,
    AttemptSucceeded,
    ChordExtended,
    ChordSent,
    MirrorEvent,
    StepDispatched,
    StepPublished,
    chord_applied,
    decode,
    encode,
    make,
    result_stored,
)

STEP = "5b0c1f1e-4a8e-4b8e-9d7e-2f0f5a1c9e11"

# One of each kind, its optional fields given (tuples and a nested adoption included).
EVERY_KIND: list[MirrorEvent] = [
    make(
        StepPublished,
        STEP,
        1.5,
        run_id="run",
        step_name="add#2",
        rpc_name="tasks.add",
        data_json='{"args":[1,"ü"]}',
        parent_step_id="parent",
        retries=3,
        retry_delay=0.25,
        eta=2.5,
        new_run=("wf", "[]", None),
        routing_json='{"routing_key":"q"}',
        chord_body="body",
    ),
    make(StepDispatched, STEP, attempt=2),
    make(
        AttemptStarted,
        STEP,
        attempt=1,
        worker="celery@w",
        pid=42,
        adoption=Adoption(
            run_id="run",
            step_name="add",
            rpc_name="tasks.add",
            published=False,
            data_json="[]",
            retries=1,
            retry_delay=5.0,
            routing_json=None,
            sent_at=1.0,
            eta=3.0,
            chord_body="body",
        ),
        delivery=False,
    ),
    make(AttemptRetried, STEP, attempt=1, error_json="{}", eta=9.0, retries=2, retry_delay=1.0),
    make(AttemptSucceeded, STEP, attempt=1, run_id="run", result_json="5", orchestrated=True),
    make(
        AttemptEnded,
        STEP,
        attempt=None,
        run_id=None,
        status="failed",
        error_json="{}",
        chord_bodies=("inner", "outer"),
    ),
    make(AttemptReplaced, STEP, attempt=1, replaced_by="other"),
    result_stored(STEP, 1, "SUCCESS", b"\x00\xff meta", None),
    chord_applied("group", ["a", "b"], b"body"),
    make(ChordExtended, "group", part="c"),
    make(ChordSent, "group"),
]


def test_every_kind_is_in_the_sample() -> None:
    kinds = {type(event) for event in EVERY_KIND}
    assert kinds == set(MirrorEvent.__subclasses__())


@pytest.mark.parametrize("event", EVERY_KIND, ids=lambda e: e.kind)
def test_an_event_survives_its_journal_line(event: MirrorEvent) -> None:
    line = encode(event)
    assert "\n" not in line
    again = decode(event.kind, line)
    assert again == event
    assert type(again) is type(event)
    assert hash(again) == hash(event)
    # Others read a line's step id without the event's class (a journal's waiting steps).
    assert json.loads(line)["step_id"] == event.step_id


def test_events_are_frozen_and_compared_by_value() -> None:
    event = make(ChordSent, "group", 1.0)
    with pytest.raises(AttributeError):
        event.step_id = "other"  # type: ignore[misc]
    same = ChordSent(id=event.id, at=1.0, step_id="group")
    assert same == event and hash(same) == hash(event)
    assert len({event, same}) == 1
    assert ChordSent(id=event.id, at=2.0, step_id="group") != event
    # A different kind with the same fields is a different event.
    assert MirrorEvent(id=event.id, at=1.0, step_id="group") != event


@pytest.mark.parametrize(
    ("kind", "payload", "says"),
    [
        ("nonsense", '{"id":"i","at":1,"step_id":"s"}', "unknown mirror event kind"),
        ("chord_sent", "{not json", "not a chord_sent event"),
        ("chord_sent", '{"id":"i","at":1}', "missing required field `step_id`"),
        ("chord_sent", '{"id":"i","at":"soon","step_id":"s"}', "Expected `float`"),
        ("chord_sent", '{"id":"i","at":1,"step_id":"s","more":1}', "unknown field `more`"),
        (
            "started",
            '{"id":"i","at":1,"step_id":"s","attempt":1,"worker":null,"pid":1,'
            '"adoption":{"run_id":"r"}}',
            "missing required field",
        ),
    ],
)
def test_what_is_no_event_is_a_value_error(kind: str, payload: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        decode(kind, payload)
