"""What must wait for what on the way to SQL: the mirror's ordering rules, each named here.

Events reach SQL from several processes' journals, late, twice and out of
order, and most rows converge whatever the order (every write moves only
forward). A few must never be seen before others; each such rule is one
function or method below, named after what it keeps, its docstring the rule:

- across processes: :func:`waits_for_its_step`, for at most :func:`overdue`'s
  grace, then :func:`adopts` and :func:`parent_link` say what goes without;
- within one journal (one process's events, in its order): :class:`Holds`,
  :meth:`~Holds.behind_its_step` and :meth:`~Holds.behind_a_publish_of_its_run`,
  until what held them :meth:`~Holds.left`.

One rule holds before anything is journaled: a task's result, which Celery
stores before it ends the attempt, waits in the process for that attempt's end
(``held_results``).

Three rules need the rows a batch finds, so the store enforces them inside the
batch's transaction (``Batches._apply`` in ``store/batches.py``) and reports the
steps it found missing (``BatchResult.missing``), whose events then wait here:

- a new step waits for its run and for the step it follows (``_place_steps``);
- a result waits with its attempt: none is written for a step the batch misses;
- a run stays open while a new step of it waits (a chain's next link, published
  before the success of the link that sends it: :meth:`~Holds.behind_a_publish_of_its_run`
  within one batch).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Sequence
from typing import Protocol, TypeVar

from pikku_celery.mirror.events import Adoption, AttemptSucceeded, MirrorEvent, StepPublished

__all__ = ["Holds", "Queued", "adopts", "overdue", "parent_link", "waits_for_its_step"]


class Queued(Protocol):
    """An event in its journal's line: its place there and the event."""

    @property
    def seq(self) -> int: ...

    @property
    def event(self) -> MirrorEvent: ...


_Q = TypeVar("_Q", bound=Queued)


def waits_for_its_step(event: MirrorEvent, missing: Collection[str]) -> bool:
    """Its step first: an event of a step its batch found missing (published by another
    process, most often one flush away) waits for it; nothing of it was written."""
    return event.step_id in missing


def overdue(deferred_since: float | None, now: float, grace: float) -> bool:
    """An event waits for another process's at most ``grace`` seconds from its first
    deferral; then it goes without (:func:`adopts`, :func:`parent_link`) or is set aside."""
    return deferred_since is not None and now - deferred_since > grace


def adopts(adoption: Adoption, overdue: bool) -> bool:
    """A started step nobody published through pikku-celery, or a lone task's, is recorded
    from its start at once; a step of a larger run waits for its publish until overdue."""
    return not adoption.published or overdue


def parent_link(event: StepPublished, overdue: bool) -> str | None:
    """A new step waits for the step it follows (the store writes it after that one:
    ``Batches._place_steps``); once it is overdue it is recorded without the link."""
    return None if overdue else event.parent_step_id


class Holds:
    """What waits in one journal, and the events behind it there that wait for it.

    Told what waits (:meth:`deferred`) and what left (:meth:`left`), it answers
    whether an event must wait (:meth:`waits`), or which of a batch's do (:meth:`behind`).
    """

    def __init__(self) -> None:
        # step id -> the seqs of its events that wait
        self._steps: dict[str, set[int]] = {}
        # run id -> the seqs of the publishes of its steps that wait
        self._publishes: dict[str, set[int]] = {}

    def __bool__(self) -> bool:
        """Whether anything waits (a publish that waits is one of its step's events)."""
        return bool(self._steps)

    def behind(self, lane: Sequence[_Q]) -> list[_Q]:
        """Of a batch's events of this journal, in its order, those that wait; decided in
        that order, so one that waits holds back those behind it as if it was deferred."""
        taken: set[int] = set()
        waiting: list[_Q] = []
        for item in lane:
            if self.waits(item, taken):
                self.deferred(item)
                waiting.append(item)
            else:
                taken.add(item.seq)
        return waiting

    def waits(self, item: Queued, taken: Container[int]) -> bool:
        """Whether ``item`` waits behind an earlier event of its journal that waits and is
        not among ``taken`` (those its batch writes before it)."""
        return self.behind_its_step(item, taken) or self.behind_a_publish_of_its_run(item, taken)

    def behind_its_step(self, item: Queued, taken: Container[int]) -> bool:
        """One process's events of a step keep their order: an event waits behind an earlier
        one of its step that waits (a redelivery's start, an attempt's end, its result)."""
        return _earlier(self._steps.get(item.event.step_id, ()), item.seq, taken)

    def behind_a_publish_of_its_run(self, item: Queued, taken: Container[int]) -> bool:
        """A step's success waits behind an earlier publish of its run that waits (a chain's
        next link), for that publish itself: else its run completes without the link."""
        event = item.event
        if not isinstance(event, AttemptSucceeded) or event.run_id is None:
            return False
        return _earlier(self._publishes.get(event.run_id, ()), item.seq, taken)

    def deferred(self, item: Queued) -> None:
        """``item`` waits in the journal: the events behind it of its step (and, for a
        publish, the successes of its run) wait for it."""
        event = item.event
        self._steps.setdefault(event.step_id, set()).add(item.seq)
        if isinstance(event, StepPublished):
            self._publishes.setdefault(event.run_id, set()).add(item.seq)

    def left(self, item: Queued) -> None:
        """What left the journal holds nothing: written, or set aside (never in the way of
        the events behind it, which go on without it)."""
        event = item.event
        _discard(self._steps, event.step_id, item.seq)
        if isinstance(event, StepPublished):
            _discard(self._publishes, event.run_id, item.seq)


def _earlier(seqs: Iterable[int], seq: int, taken: Container[int]) -> bool:
    return any(held < seq and held not in taken for held in seqs)


def _discard(held: dict[str, set[int]], key: str, seq: int) -> None:
    seqs = held.get(key)
    if seqs is not None:
        seqs.discard(seq)
        if not seqs:
            del held[key]
