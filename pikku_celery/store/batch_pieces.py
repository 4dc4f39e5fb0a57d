"""A batch in pieces, one per key group, for tables spread over servers by key (Citus).

Each piece holds the rows of one group of keys: its runs' steps, attempts, deliveries
and outcomes (keyed by run id), and the results, chords and chord parts whose own key
(task id, group id) falls in the group. Committed one after another, each piece's
transaction takes its locks on one server, so two flushers never wait for each other
across servers (the deadlock a batch spanning shards meets) and a batch of lone tasks
is a set of single-shard transactions.

A result waits for its attempt's end when both are in the batch: one whose step's run
falls in another group goes in a second round of pieces, after every run's piece has
committed, and is left out when its step turned out to be missing. Every write is
forward-only and idempotent, so a batch whose later piece failed is applied again whole.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pikku_celery.errors import StoreError
from pikku_celery.store.mirror_batch import BatchResult, MirrorBatch

__all__ = ["Elsewhere", "KeyGroups", "PartlyWritten", "Pieces", "pieces"]


class KeyGroups(Protocol):
    """The group (a shard) of each key: a run id, a task id, a chord's group id."""

    def __call__(self, keys: Collection[str]) -> Mapping[str, int]: ...


class PartlyWritten(StoreError):
    """A batch applied in pieces failed after some of them committed.

    ``written``: what the committed pieces did (their chords claimed, to fire now: a
    chord is claimed once, and applying the batch again fires it no more). ``cause``:
    the failure, which says whether to apply the whole batch again later (an outage) or
    to look for the event that can never be applied."""

    def __init__(self, written: BatchResult, cause: Exception) -> None:
        super().__init__(f"a batch committed in part, then failed: {cause}")
        self.written = written
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Pieces:
    """``first``: one piece per group, in group order, each with the runs whose rows it
    writes; ``then``: the results whose step's run is in another group, one piece per
    group, written after all of ``first``."""

    first: list[tuple[MirrorBatch, frozenset[str]]]
    then: list[MirrorBatch]


@dataclass(slots=True)
class Elsewhere:
    """Runs a piece found to end that are another group's (a chord's header tasks' runs,
    released or failed by its body's step): ended after the pieces, a group at a time.
    ``waiting``: runs with a new step that could not be written, which none completes."""

    complete: dict[str, dt.datetime] = field(default_factory=dict)
    settle: dict[str, dict[str, Any]] = field(default_factory=dict)
    waiting: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.complete or self.settle)


def pieces(batch: MirrorBatch, run_of: Mapping[str, str], groups: KeyGroups) -> Pieces:
    """``batch`` cut by ``groups``; ``run_of``: the run of each step the batch names (a
    step not there is keyed by the run its outcome names, else by its own id: it is
    reported missing whichever piece has it)."""

    # A step the batch's lookup did not find (its publish committed a moment later) goes
    # with the run its outcome names: its attempt's end and its run's completion check in
    # one transaction, or the check could run before the end it waits for is written.
    runs_named = {o.step_id: o.run_id for o in batch.outcomes if o.run_id is not None}

    def run_key(step_id: str) -> str:
        return run_of.get(step_id) or runs_named.get(step_id) or step_id

    keys = {s.run_id for s in batch.steps}
    keys |= {run_key(t.step_id) for t in batch.transitions}
    keys |= {o.run_id or run_key(o.step_id) for o in batch.outcomes}
    keys |= {run_key(h.step_id) for h in batch.handovers}
    keys |= {r.task_id for r in batch.results}
    keys |= {c.group_id for c in batch.chords}
    keys |= {group_id for group_id, _ in batch.chord_parts}
    keys |= {group_id for group_id, _ in batch.chords_sent}
    group_of = groups(sorted(keys))
    first: dict[int, MirrorBatch] = {}
    then: dict[int, MirrorBatch] = {}
    runs: dict[int, set[str]] = {}

    def piece(key: str, into: dict[int, MirrorBatch] = first) -> MirrorBatch:
        group = group_of[key]
        found = into.get(group)
        if found is None:
            found = into[group] = MirrorBatch()
        return found

    def run_piece(run_id: str) -> MirrorBatch:
        runs.setdefault(group_of[run_id], set()).add(run_id)
        return piece(run_id)

    for step in batch.steps:
        run_piece(step.run_id).steps.append(step)
    for transition in batch.transitions:
        run_piece(run_key(transition.step_id)).transitions.append(transition)
    for outcome in batch.outcomes:
        run_piece(outcome.run_id or run_key(outcome.step_id)).outcomes.append(outcome)
    for handover in batch.handovers:
        run_piece(run_key(handover.step_id)).handovers.append(handover)
    stepped = {s.step_id for s in batch.steps} | {t.step_id for t in batch.transitions}
    stepped |= {o.step_id for o in batch.outcomes}
    for result in batch.results:
        apart = result.task_id in stepped and (
            group_of[run_key(result.task_id)] != group_of[result.task_id]
        )
        piece(result.task_id, then if apart else first).results.append(result)
    for chord in batch.chords:
        piece(chord.group_id).chords.append(chord)
    for added in batch.chord_parts:
        piece(added[0]).chord_parts.append(added)
    for sent in batch.chords_sent:
        piece(sent[0]).chords_sent.append(sent)
    return Pieces(
        [(first[g], frozenset(runs.get(g, ()))) for g in sorted(first)],
        [then[g] for g in sorted(then)],
    )
