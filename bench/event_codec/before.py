"""The mirror's events as they were before msgspec, for ``bench.event_codec`` to compare:
frozen slotted dataclasses, turned into a dict and dumped by the standard library's
``json``, decoded by ``json.loads`` and ``cls(**document)``. A copy of the kinds a lone
task journals, kept as it was; its ``loads`` is a parameter so that orjson can decode
the same documents.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

from pikku_celery.mirror.events import new_event_id

__all__ = [
    "Adoption",
    "AttemptStarted",
    "AttemptSucceeded",
    "MirrorEvent",
    "ResultStored",
    "StepPublished",
    "decode",
    "encode",
    "make",
]


@dataclass(frozen=True, slots=True)
class MirrorEvent:
    kind: ClassVar[str] = ""
    id: str
    at: float
    step_id: str


@dataclass(frozen=True, slots=True)
class StepPublished(MirrorEvent):
    kind: ClassVar[str] = "published"
    run_id: str
    step_name: str
    rpc_name: str
    data_json: str
    parent_step_id: str | None = None
    retries: int | None = None
    retry_delay: float | None = None
    eta: float | None = None
    new_run: tuple[str, str, str | None] | None = None
    routing_json: str | None = None
    chord_body: str | None = None


@dataclass(frozen=True, slots=True)
class Adoption:
    run_id: str
    step_name: str
    rpc_name: str
    published: bool
    data_json: str | None = None
    retries: int | None = None
    retry_delay: float | None = None
    routing_json: str | None = None
    sent_at: float | None = None
    eta: float | None = None
    chord_body: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptStarted(MirrorEvent):
    kind: ClassVar[str] = "started"
    attempt: int
    worker: str | None
    pid: int
    adoption: Adoption | None = None
    delivery: bool = True


@dataclass(frozen=True, slots=True)
class AttemptSucceeded(MirrorEvent):
    kind: ClassVar[str] = "succeeded"
    attempt: int
    run_id: str | None
    result_json: str
    orchestrated: bool = False


@dataclass(frozen=True, slots=True)
class ResultStored(MirrorEvent):
    kind: ClassVar[str] = "result"
    attempt: int | None
    state: str
    meta_b64: str
    date_done: float | None = None


_KINDS: Final[dict[str, type[MirrorEvent]]] = {
    cls.kind: cls for cls in (StepPublished, AttemptStarted, AttemptSucceeded, ResultStored)
}
_FIELDS: Final = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _KINDS.values()}
_ADOPTION_FIELDS: Final = tuple(f.name for f in dataclasses.fields(Adoption))


def encode(event: MirrorEvent) -> str:
    document = {name: getattr(event, name) for name in _FIELDS[type(event)]}
    adoption = document.get("adoption")
    if isinstance(adoption, Adoption):
        document["adoption"] = {f: getattr(adoption, f) for f in _ADOPTION_FIELDS}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


def decode(kind: str, payload: str, loads: Callable[[str], Any] = json.loads) -> MirrorEvent:
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(f"unknown mirror event kind {kind!r}")
    document: dict[str, Any] = loads(payload)
    if cls is AttemptStarted and document.get("adoption") is not None:
        document["adoption"] = Adoption(**document["adoption"])
    if cls is StepPublished and document.get("new_run") is not None:
        document["new_run"] = tuple(document["new_run"])
    try:
        return cls(**document)
    except TypeError as exc:
        raise ValueError(f"a {kind} event with the wrong fields: {exc}") from exc


_E = TypeVar("_E", bound=MirrorEvent)


def make(kind: type[_E], step_id: str, at: float | None = None, **fields: Any) -> _E:
    return kind(id=new_event_id(), at=time.time() if at is None else at, step_id=step_id, **fields)
