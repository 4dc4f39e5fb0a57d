"""When the flusher thread writes: a result a reader waits for goes at once while the
process is nearly idle, whenever it was appended."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from pikku_celery.mirror.flusher import Flusher
from pikku_celery.mirror.outage import Outage

# Far longer than any wait the tests allow: a write that waits out the interval fails them.
INTERVAL = 60.0


class Journal:
    """Stands in for a journal: only when its earliest event is due."""

    def __init__(self) -> None:
        self.due: float | None = None

    def next_due(self) -> float | None:
        return self.due


def flusher_of(journal: Journal, write: Any) -> Flusher:
    return Flusher(
        lambda: [journal],  # type: ignore[list-item]
        write,
        outage=Outage(),
        chores=[],
        flush_interval=INTERVAL,
        adopt_interval=INTERVAL,
    )


def test_a_result_appended_while_a_small_pass_writes_goes_in_the_next_pass_at_once() -> None:
    journal = Journal()
    passes: list[int] = []
    second = threading.Event()
    flusher: Flusher

    def write(journals: Sequence[Any]) -> int:
        written = 1 if journal.due is not None else 0
        journal.due = None
        passes.append(written)
        if len(passes) == 1:
            # A task's result, appended by a pool process while this pass writes its start.
            journal.due = time.time()
            flusher.wake(at_once=True)
        elif written:
            second.set()
        return written

    flusher = flusher_of(journal, write)
    journal.due = time.time()
    flusher.start()
    flusher.wake()
    try:
        assert second.wait(INTERVAL / 4), "the result waited out the flush interval"
    finally:
        flusher.join(flusher.halt(), timeout=5)


def test_a_busy_process_gathers_for_the_interval_even_for_a_result() -> None:
    journal = Journal()
    passes: list[float] = []
    flusher: Flusher

    def write(journals: Sequence[Any]) -> int:
        passes.append(time.monotonic())
        journal.due = None
        if len(passes) == 1:
            journal.due = time.time()
            flusher.wake(at_once=True)
        return 100  # a large pass: many events per interval

    flusher = flusher_of(journal, write)
    journal.due = time.time()
    flusher.start()
    flusher.wake()
    try:
        time.sleep(1.0)
        # One commit for many events: the second pass waits for the interval.
        assert len(passes) == 1
    finally:
        flusher.join(flusher.halt(), timeout=5)
