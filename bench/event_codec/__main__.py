"""What making, encoding and decoding the mirror's events costs: msgspec Structs (the events
now) against the frozen dataclasses through the standard library's ``json`` that they
replaced (a copy is kept in ``bench/event_codec/before.py``), and orjson over those same
dataclasses.

A lone task's four events are the mix: its publish (a new run), its start with the
adoption a worker records the step from, its success and its result. Each side makes and
encodes ``--tasks`` tasks' events (the pool process's and publisher's part: a new id, the
time, the event, one line of JSON as the journal takes it), then decodes them all (the
flusher's part), in ``--rounds`` rounds that alternate the sides' order; the figures are
the median round's CPU microseconds per event.

    python -m bench.event_codec [--tasks 20000] [--rounds 5]
"""

from __future__ import annotations

import base64
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from bench.event_codec import before
from bench.harness.options import parser
from bench.harness.report import say, table
from bench.harness.turns import alternated
from pikku_celery.mirror import events as now

_ID: Final = "5b0c1f1e-4a8e-4b8e-9d7e-2f0f5a1c9e11"
_DATA: Final = '{"args":[2,3],"kwargs":{}}'
_ROUTING: Final = '{"exchange":"","routing_key":"celery"}'
# Celery's meta of a task's success as its JSON result serializer encodes it.
_META: Final = (
    b'{"status":"SUCCESS","result":5,"traceback":null,"children":[],'
    b'"date_done":"2026-12-04T16:00:00.000000+00:00","task_id":"' + _ID.encode() + b'"}'
)
_EVENTS_PER_TASK: Final = 4


@dataclass(frozen=True)
class Family:
    """One implementation of the events: the classes a lone task's events are made of."""

    published: type[Any]
    adoption: type[Any]
    started: type[Any]
    succeeded: type[Any]
    result: type[Any]
    make: Callable[..., Any]


def lone_task(family: Family) -> list[Any]:
    """The events a lone task journals, made as the mirror makes them."""
    make = family.make
    sent = time.time()
    adoption = family.adoption(
        run_id=_ID,
        step_name="tasks.add",
        rpc_name="tasks.add",
        published=False,
        data_json=_DATA,
        retries=3,
        retry_delay=180.0,
        routing_json=_ROUTING,
        sent_at=sent,
    )
    return [
        make(
            family.published,
            _ID,
            sent,
            run_id=_ID,
            step_name="tasks.add",
            rpc_name="tasks.add",
            data_json=_DATA,
            retries=3,
            retry_delay=180.0,
            new_run=("tasks.add", _DATA, None),
            routing_json=_ROUTING,
        ),
        make(
            family.started,
            _ID,
            attempt=1,
            worker="celery@worker-7",
            pid=os.getpid(),
            adoption=adoption,
        ),
        make(family.succeeded, _ID, attempt=1, run_id=_ID, result_json="5"),
        make(
            family.result,
            _ID,
            attempt=1,
            state="SUCCESS",
            meta_b64=base64.b64encode(_META).decode("ascii"),
            date_done=None,
        ),
    ]


@dataclass(frozen=True)
class Side:
    name: str
    family: Family
    encode: Callable[[Any], str]
    decode: Callable[[str, str], Any]


@dataclass
class Figures:
    """CPU microseconds per event, one entry per round."""

    make: list[float]
    encode: list[float]  # make and encode
    decode: list[float]


def _per_event(took: float, tasks: int) -> float:
    return took / (tasks * _EVENTS_PER_TASK) * 1e6


def measure(side: Side, tasks: int, figures: Figures) -> None:
    family, encode, decode = side.family, side.encode, side.decode
    start = time.process_time()
    for _ in range(tasks):
        lone_task(family)
    figures.make.append(_per_event(time.process_time() - start, tasks))
    lines: list[tuple[str, str]] = []
    keep = lines.append
    start = time.process_time()
    for _ in range(tasks):
        for event in lone_task(family):
            keep((event.kind, encode(event)))
    figures.encode.append(_per_event(time.process_time() - start, tasks))
    start = time.process_time()
    for kind, payload in lines:
        decode(kind, payload)
    figures.decode.append(_per_event(time.process_time() - start, tasks))


def sides() -> list[Side]:
    dataclasses = Family(
        before.StepPublished,
        before.Adoption,
        before.AttemptStarted,
        before.AttemptSucceeded,
        before.ResultStored,
        before.make,
    )
    structs = Family(
        now.StepPublished,
        now.Adoption,
        now.AttemptStarted,
        now.AttemptSucceeded,
        now.ResultStored,
        now.make,
    )
    found = [Side("json, dataclasses (before)", dataclasses, before.encode, before.decode)]
    try:
        import orjson
    except ImportError:
        say("orjson is not installed (pip install -e '.[bench]'): its side is left out")
    else:
        found.append(
            Side(
                "orjson, dataclasses",
                dataclasses,
                lambda event: orjson.dumps(event).decode(),
                lambda kind, payload: before.decode(kind, payload, orjson.loads),
            )
        )
    found.append(Side("msgspec Structs (now)", structs, now.encode, now.decode))
    return found


def main(argv: Sequence[str] | None = None) -> None:
    options = parser(
        "event_codec",
        __doc__.split("\n\n")[0],
        quick="2,000 tasks, 2 rounds",
        rounds=(5, 2, "the sides' order alternates; the median is reported"),
    )
    options.size("--tasks", 20_000, 2_000, "lone tasks a round")
    args = options.read(argv)
    compared = sides()
    figures = {side.name: Figures([], [], []) for side in compared}
    for turn in range(args.rounds):
        for side in alternated(compared, turn):
            measure(side, args.tasks, figures[side.name])
    size = sum(len(now.encode(event)) for event in lone_task(compared[-1].family))
    say(
        f"{args.tasks} lone tasks of {_EVENTS_PER_TASK} events ({size} bytes of JSON a task), "
        f"{args.rounds} rounds, load average {os.getloadavg()[0]:.2f}; "
        "median CPU µs per event"
    )
    first = None
    rows = []
    for side in compared:
        own = figures[side.name]
        made, encoded, decoded = (statistics.median(v) for v in (own.make, own.encode, own.decode))
        task = (encoded + decoded) * _EVENTS_PER_TASK
        first = first or task
        rows.append(
            [
                side.name,
                f"{made:.2f}",
                f"{encoded:.2f}",
                f"{decoded:.2f}",
                f"{task:.1f}",
                f"{first / task:.2f}x",
            ]
        )
    table(["side", "make", "make+encode", "decode", "µs a task", "speed-up"], rows)
    say("(make: the events alone; µs a task: a task's four events made, encoded and decoded)")


if __name__ == "__main__":
    main()
