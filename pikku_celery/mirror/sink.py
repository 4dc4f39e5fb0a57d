"""The sink port: where a process's mirror events go, one implementation per process role.

A process's role decides what happens to an event once it is made: a publisher
(or a solo or threads worker) journals it and writes its own journal from a
flusher thread, or, hosted, only appends and a node's flusher on its machine
writes it; a prefork worker's main process also writes the journals of
its pool processes, which only append; a test (or ``Recorder.redirected``)
writes when it asks; a process that stores results without a mirror writes
each event at once. Each role is one :class:`EventSink`, chosen once (see
``sinks``): nothing that hands it an event asks which role it is in.

What runs after a batch's COMMIT (replays of durable runs, the bodies of
chords the batch completed) belongs to the sink that committed: it calls its
:class:`AfterCommit`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

from pikku_celery.mirror.events import MirrorEvent, ResultStored
from pikku_celery.store import FiredChord, WorkflowStore

__all__ = [
    "AfterCommit",
    "ChordsFired",
    "Committed",
    "EventSink",
    "Place",
    "PublisherJournal",
    "SinkSettings",
    "SinkStats",
    "awaited",
]

logger = logging.getLogger(__name__)

#: Called with the durable-workflow runs whose step ended, once that is committed.
Committed = Callable[[Sequence[str]], None]
#: Called with the chords whose bodies are to be sent, once the batch that claimed them
#: committed (the result backend's native chords).
ChordsFired = Callable[[Sequence[FiredChord]], None]

#: Who writes a publisher's journal: ``"own"``, its own flusher thread; ``"node"``, a node's
#: flusher on its machine (a worker's main process, ``pikku-celery flusher``).
PublisherJournal = Literal["own", "node"]

# Celery's ready states: what AsyncResult.get() waits for.
_READY: Final = frozenset({"SUCCESS", "FAILURE", "REVOKED"})


def awaited(event: MirrorEvent) -> bool:
    """Whether a reader waits for this event's batch (``AsyncResult.get()`` for a ready
    result; the task's own end was journaled before it), so that after an idle spell it
    is written at once. A publish never is: a canvas's run must not be written with only
    some of its steps, and a STARTED or progress state has nobody waiting on it."""
    return isinstance(event, ResultStored) and event.state in _READY


@dataclass(frozen=True, slots=True)
class SinkStats:
    """What a sink did; ``lags``: seconds from each written event to its COMMIT;
    ``unserved``: how many times a hosted publisher found that no process consumed its
    journal (its events wait on disk for a node's flusher)."""

    appended: int
    written: int
    batches: int
    set_aside: int
    lags: list[float]
    unserved: int = 0


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """How a sink writes, fixed when the recorder is made. ``background``: a process that
    writes its own journal does so from a flusher thread (False: when asked);
    ``publisher``: who writes a publisher's journal (``"node"``: it only appends)."""

    flush_interval: float
    batch_size: int
    adopt_interval: float
    grace: float
    background: bool
    publisher: PublisherJournal = "own"


@dataclass(frozen=True, slots=True)
class Place:
    """The store a sink writes to, and the folder of that database's journals."""

    store: WorkflowStore
    folder: Path
    database: str

    def current_store(self) -> WorkflowStore:
        return self.store

    def current_folder(self) -> Path:
        return self.folder

    def current_database(self) -> str:
        return self.database


class AfterCommit:
    """The listeners a committing sink calls after COMMIT, each failure logged and isolated.

    One per recorder, shared by every sink it chooses (after a fork, when redirected),
    so a listener added at any time hears every batch.
    """

    def __init__(self) -> None:
        self._replays: list[Committed] = []
        self._chords: list[ChordsFired] = []

    def on_committed(self, listener: Committed) -> None:
        self._replays.append(listener)

    def on_chords_fired(self, listener: ChordsFired) -> None:
        self._chords.append(listener)

    def committed(self, runs: Sequence[str]) -> None:
        for listener in self._replays:
            try:
                listener(runs)
            except Exception:
                logger.exception(
                    "pikku-celery could not replay workflow runs %s after their step ended",
                    ", ".join(runs),
                    extra={"action": "replay_after_commit_failed"},
                )

    def chords_fired(self, chords: Sequence[FiredChord]) -> None:
        for listener in self._chords:
            try:
                listener(chords)
            except Exception:
                logger.exception(
                    "pikku-celery could not send the bodies of chords %s",
                    ", ".join(c.group_id for c in chords),
                    extra={"action": "chord_fire_failed"},
                )


class EventSink(Protocol):
    """Where this process's events go. Chosen once per role (see ``sinks``)."""

    def append(self, event: MirrorEvent) -> None:
        """Take the event: durable (journaled, or in SQL) when this returns."""

    def flush(self) -> bool:
        """Write what is due now; False when the database is away."""

    def start(self) -> None:
        """Start writing now, before any event (to adopt the journals of dead processes)."""

    def adopt_orphans(self, *, set_aside_too: bool = False) -> int:
        """Write the journals left by processes that are gone; how many events went.
        ``set_aside_too``: first put back the events they set aside."""

    def depth(self) -> int:
        """Events of this process that wait for SQL."""

    def stats(self) -> SinkStats: ...

    def close(self, timeout: float = 10.0) -> None:
        """Write what is due now; what is left stays in the journal for adoption.
        ``timeout`` bounds the wait for a flusher thread's batch in flight."""

    def forked(self) -> EventSink:
        """The sink of a process forked from this one's (called in the child, once)."""
