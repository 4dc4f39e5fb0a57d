"""The mirror's group commit: a whole batch of new steps, transitions and outcomes at once.

One transaction per batch. First one read of every step the batch names (is
it there, which attempt is current, which run is it in), then each kind of
statement sent once with all its parameter sets. Applying the same batch
twice changes nothing: every statement is guarded to move rows only
forward, and deliveries are counted through a ledger of event ids.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Final

import sqlalchemy as sa

from pikku_celery.durations import format_duration
from pikku_celery.errors import InvalidDuration, InvalidStatus
from pikku_celery.store import sql
from pikku_celery.store.batch_pieces import Elsewhere, KeyGroups, PartlyWritten, pieces
from pikku_celery.store.batch_writes import Later
from pikku_celery.store.common import like_prefix, new_id, run_day
from pikku_celery.store.connector import Connector
from pikku_celery.store.mirror_batch import (
    TRANSITION_STATUSES,
    BatchResult,
    Handover,
    MirrorBatch,
    NewStep,
    RunOutcome,
    StepTransition,
)
from pikku_celery.store.models import run_kind
from pikku_celery.store.results import Results

__all__ = ["Batches"]

logger = logging.getLogger(__name__)

#: What the batch's one read tells of a step: its current attempt, its run, that run's
#: ``wire`` (a durable workflow's or not) and its day.
Known = tuple[int, str, Any, dt.date | None]


# The steps this process warned of: a lone task's step is recorded by its worker and again
# by its publisher, and one warning says it. Bounded: a long-lived process forgets.
_WARNED: dict[str, None] = {}
_WARNED_KEPT: Final = 1024


def _delay_text(seconds: float | None, step_id: str) -> str | None:
    """A step's retry delay as the tables hold it. One no duration expresses (a Celery
    task option set by hand to -1) is left out, with a warning (once per step in a
    process): the step is recorded anyway, and the task it mirrors never hears of it."""
    if seconds is None:
        return None
    try:
        return format_duration(seconds)
    except InvalidDuration:
        if step_id in _WARNED:
            return None
        if len(_WARNED) >= _WARNED_KEPT:
            _WARNED.clear()
        _WARNED[step_id] = None
        logger.warning(
            "retry delay %r of step %s is not a duration; the step is recorded without it",
            seconds,
            step_id,
            extra={"action": "retry_delay_left_out", "step_id": step_id},
        )
        return None


class Batches:
    """The mirror's port: a batch of events' rows in one transaction."""

    def __init__(self, db: Connector, results: Results) -> None:
        self._db = db
        self._results = results
        # The dialect's own way of sending each kind of a batch's statements.
        self._sql = db.sql.batch_writes(db)
        self._open_chord = db.sql.open_chord

    def apply_batch(self, batch: MirrorBatch, *, conn: sa.Connection | None = None) -> BatchResult:
        """Write a batch in one transaction (the caller's, if given); see :class:`BatchResult`.

        In a transaction of its own, the chords the batch's chords and results complete
        fire even when another batch wrote the rest at the same moment; in the caller's,
        the caller calls ``results.settle`` after its COMMIT for that."""
        for transition in batch.transitions:
            if transition.status not in TRANSITION_STATUSES:
                raise InvalidStatus("attempt", transition.status, TRANSITION_STATUSES)
        if conn is not None:
            with self._db.write(conn) as c:
                return self._apply(c, batch, commit=False)
        groups = self._db.key_groups
        result = self._commit(batch) if groups is None else self._commit_pieces(batch, groups)
        # Its chords and results were counted before the other batches' of the moment
        # committed: looked at again now, the chords they complete fire (``settle``).
        chords = [h.group_id for h in batch.chords] + [g for g, _ in batch.chord_parts]
        ready = [r.task_id for r in batch.results if r.status in sql.results.READY_STATES]
        late = self._results.settle(chords, ready)
        return dataclasses.replace(result, fired=(*result.fired, *late)) if late else result

    def _commit(
        self,
        batch: MirrorBatch,
        own: frozenset[str] | None = None,
        elsewhere: Elsewhere | None = None,
    ) -> BatchResult:
        with self._db.writers_in_turn(None), self._db.write(None) as c:
            self._db.layout.learn(c)
            return self._apply(c, batch, commit=True, own=own, elsewhere=elsewhere)

    def _commit_pieces(self, batch: MirrorBatch, groups: KeyGroups) -> BatchResult:
        """The batch in one transaction per group of keys (``batch_pieces``), in order; a
        failure after one committed is :class:`PartlyWritten`, with what those did."""
        named = {t.step_id for t in batch.transitions} | {o.step_id for o in batch.outcomes}
        named |= {h.step_id for h in batch.handovers}
        run_of = {s.step_id: s.run_id for s in batch.steps}
        lookup = sorted(named - set(run_of))
        if lookup:
            with self._db.read(None) as c:
                for step_id, _, run_id, _, _ in self._sql.known_steps(c, lookup):
                    run_of[step_id] = run_id
        cut = pieces(batch, run_of, groups)
        written = BatchResult(frozenset(), ())
        elsewhere = Elsewhere()
        committed = 0
        try:
            for piece, own in cut.first:
                written = _joined(written, self._commit(piece, own, elsewhere))
                committed += 1
            for piece in cut.then:
                # A result waits with its step, which its run's piece found missing.
                piece.results = [r for r in piece.results if r.task_id not in written.missing]
                if piece.results:
                    written = _joined(written, self._commit(piece))
                committed += 1
            if elsewhere:
                self._end_elsewhere(elsewhere, groups)
        except Exception as exc:
            if not committed:
                raise
            raise PartlyWritten(written, exc) from exc
        return written

    def prune_deliveries(self, before: dt.datetime) -> int:
        """Forget counted deliveries older than ``before`` (a journal older than that is
        no longer protected against counting its deliveries twice)."""
        with self._db.write(None) as c:
            return int(c.execute(sql.batches.prune_deliveries, {"before": before}).rowcount)

    # --- the steps of one batch ---------------------------------------------------

    def _end_elsewhere(self, elsewhere: Elsewhere, groups: KeyGroups) -> None:
        """End the runs the pieces found to end in other groups, a group per transaction."""
        complete = {
            run_id: at
            for run_id, at in elsewhere.complete.items()
            if run_id not in elsewhere.waiting and run_id not in elsewhere.settle
        }
        group_of = groups(sorted(set(complete) | set(elsewhere.settle)))
        for group in sorted(set(group_of.values())):
            with self._db.writers_in_turn(None), self._db.write(None) as c:
                later: Later = []
                self._sql.write_outcomes(
                    c,
                    {run_id: at for run_id, at in complete.items() if group_of[run_id] == group},
                    [row for run_id, row in elsewhere.settle.items() if group_of[run_id] == group],
                    later,
                    {},  # looked up, on the runs' own shard
                )
                self._sql.send(c, later, commit=True)

    def _apply(
        self,
        c: sa.Connection,
        batch: MirrorBatch,
        *,
        commit: bool,
        own: frozenset[str] | None = None,
        elsewhere: Elsewhere | None = None,
    ) -> BatchResult:
        """Write what the batch can and report the steps it misses (nothing of theirs is
        written). What waits for what is the caller's to decide, but for three rules that
        need the rows this transaction finds: a new step after its run and the step it
        follows, a result with its attempt, a run open while a new step of it waits.
        ``commit``: the transaction is the batch's own, committed with its last writes."""
        new_ids = {step.step_id for step in batch.steps}
        wanted = {t.step_id for t in batch.transitions} | {o.step_id for o in batch.outcomes}
        wanted |= {h.step_id for h in batch.handovers}
        wanted |= {s.parent_step_id for s in batch.steps if s.parent_step_id is not None}
        known: dict[str, Known] = {}
        # The day of each run the batch writes rows of: every row of a run carries it.
        days: dict[str, dt.date | None] = {}
        lookup = sorted(wanted - new_ids)
        if lookup:
            for step_id, attempt, run_id, wire, day in self._sql.known_steps(c, lookup):
                known[step_id] = (int(attempt or 1), run_id, wire, day)
                days[run_id] = day

        placed, missing = self._place_steps(c, batch.steps, known, days)
        # The deliveries of the transitions whose step is there or about to be are counted
        # with the steps' writes; those of a step that could not be written are taken back.
        run_of = {step_id: run_id for step_id, (_, run_id, _, _) in known.items()}
        run_of.update((s.step_id, s.run_id) for s in placed)
        unwritten, counted = self._write_steps(
            c, placed, [t for t in batch.transitions if t.step_id in run_of], run_of, days
        )
        missing |= unwritten
        written = [s for s in placed if s.step_id not in missing]
        self._open_chords(c, written, days)
        released = self._released_runs(c, written, days)
        for step in placed:
            if step.step_id not in missing:
                known.setdefault(step.step_id, (1, step.run_id, None, days[step.run_id]))

        transitions = [t for t in batch.transitions if t.step_id in known]
        missing |= {t.step_id for t in batch.transitions if t.step_id not in known}
        if unwritten:
            counted -= self._uncount(c, batch.transitions, unwritten, counted, run_of)
        # The writes no answer is awaited of wait here (PostgreSQL), to go in one round trip.
        later: Later = []
        self._write_transitions(c, transitions, known, counted, later)
        handovers = [h for h in batch.handovers if h.step_id in known]
        missing |= {h.step_id for h in batch.handovers if h.step_id not in known}
        if handovers or batch.chord_parts or batch.results or batch.chords or batch.chords_sent:
            self._sql.send(c, later)  # in order: what follows reads what these wrote
        self._write_handovers(c, handovers, known)

        # A result is written with its attempt's end: one whose step waits, waits with it.
        # Before the results: a header task adds to its chord before its own result.
        self._results.add_to_chords(batch.chord_parts, conn=c)
        fired = self._results.write(
            [r for r in batch.results if r.task_id not in missing], conn=c, chords=batch.chords
        )
        self._results.mark_sent(batch.chords_sent, conn=c)

        outcomes = [o for o in batch.outcomes if o.step_id in known]
        missing |= {o.step_id for o in batch.outcomes if o.step_id not in known}
        # A run with a new step that waits (its link before it is not in SQL yet, or it
        # lost a name race) is not done, whatever its written steps say: a chain's next
        # link is published before the success of the link that sends it.
        waiting = {s.run_id for s in batch.steps if s.step_id in missing}
        replay = self._write_outcomes(
            c, outcomes, known, days, waiting, released, later, own, elsewhere
        )
        self._sql.send(c, later, commit=commit)
        return BatchResult(frozenset(missing), tuple(replay), tuple(fired))

    def _place_steps(
        self,
        c: sa.Connection,
        new: Sequence[NewStep],
        known: dict[str, Known],
        days: dict[str, dt.date | None],
    ) -> tuple[list[NewStep], set[str]]:
        """The new steps that can be written now: their run and the step they follow exist.
        Learns the day of each of their runs (``days``)."""
        for s in new:
            if s.run_workflow is not None:
                # A run made with its step is filed under the day its publish stamped:
                # its publisher and a worker that records it first both write that day.
                days.setdefault(s.run_id, run_day(s.at))
        made_runs = {s.run_id for s in new if s.run_workflow is not None}
        runs_needed = sorted({s.run_id for s in new if s.run_workflow is None} - set(days))
        existing_runs = made_runs | (set(days) & {s.run_id for s in new})
        if runs_needed:
            found = self._sql.known_runs(c, runs_needed)
            days.update(found)
            existing_runs |= set(found)
        placed: list[NewStep] = []
        missing: set[str] = set()
        present = set(known)
        for step in new:
            parent = step.parent_step_id
            if step.run_id not in existing_runs or (parent is not None and parent not in present):
                missing.add(step.step_id)
                continue
            placed.append(step)
            present.add(step.step_id)
        return placed, missing

    def _write_steps(
        self,
        c: sa.Connection,
        placed: Sequence[NewStep],
        hopeful: Sequence[StepTransition],
        run_of: dict[str, str],
        days: dict[str, dt.date | None],
    ) -> tuple[set[str], set[str]]:
        """Insert the steps and count the deliveries of the ``hopeful`` transitions; returns
        the ids of the steps that could not be written (a name race) and the deliveries
        counted now."""
        deliveries = self._delivery_rows(hopeful, run_of, days)
        if not placed:
            return set(), self._sql.count_deliveries(c, deliveries) if deliveries else set()
        rows = [
            {
                "run_id": s.run_id,
                "step_id": s.step_id,
                "base_name": s.step_name,
                "name_pattern": like_prefix(s.step_name, "#%"),
                "rpc_name": s.rpc_name,
                "data": s.data_json,
                "retries": s.retries,
                "retry_delay": _delay_text(s.retry_delay, s.step_id),
                "from_step_name": s.from_step_name,
                "parent_step_id": s.parent_step_id,
                "now": s.at,
                "history_id": new_id(),
                "eta": s.eta,
                "task_id": s.step_id,
                "run_workflow": s.run_workflow,
                "run_input": s.run_input_json,
                "run_wire": s.run_wire_json,
                "routing": s.routing_json,
                "run_day": days[s.run_id],
            }
            for s in placed
        ]
        present, counted = self._sql.write_steps(c, rows, placed, deliveries)
        return self._not_written(c, placed, present, days), counted

    def _open_chords(
        self, c: sa.Connection, written: Sequence[NewStep], days: dict[str, dt.date | None]
    ) -> None:
        rows = [
            {"body_id": s.chord_body, "run_id": s.run_id, "now": s.at, "run_day": days[s.run_id]}
            for s in written
            if s.chord_body is not None
        ]
        if rows:
            # Before the outcomes below: a header's success in this batch must not
            # complete the run its chord holds open.
            self._db.run_many(c, self._open_chord, rows)

    def _released_runs(
        self, c: sa.Connection, written: Sequence[NewStep], days: dict[str, dt.date | None]
    ) -> dict[str, dt.datetime]:
        """Runs whose chord's body is now written: each may complete now (if its steps all
        succeeded), though none of its own steps ended in this batch.

        A body follows a header task in that task's run, so only such steps are looked up:
        a lone task's publish stays one statement."""
        at = {s.step_id: s.at for s in written if s.run_workflow is None and s.parent_step_id}
        if not at:
            return {}
        # The chords' rows say their bodies are written from now on: a run's completion
        # reads only its own rows.
        held = c.execute(sql.batches.mark_bodies_written, {"body_ids": sorted(at)}).all()
        days.update((run_id, day) for run_id, day in held)
        latest = max(at.values())
        return dict.fromkeys((run_id for run_id, _ in held), latest)

    def _not_written(
        self,
        c: sa.Connection,
        placed: Sequence[NewStep],
        present: set[str],
        days: dict[str, dt.date | None],
    ) -> set[str]:
        ids = sorted({s.step_id for s in placed} - present)
        if not ids:
            return set()
        runs = sorted({s.run_id for s in placed if s.step_id in ids})
        on = sorted({day for run_id in runs if (day := days[run_id]) is not None})
        return set(ids) - self._sql.steps_present(c, runs, ids, on)

    @staticmethod
    def _delivery_rows(
        transitions: Iterable[StepTransition],
        run_of: dict[str, str],
        days: dict[str, dt.date | None],
    ) -> list[dict[str, Any]]:
        return [
            {
                "workflow_run_id": run_of[t.step_id],
                "event_id": event_id,
                "created_at": t.running_at or t.at,
                "run_day": days[run_of[t.step_id]],
            }
            for t in transitions
            for event_id in t.delivery_ids
        ]

    def _uncount(
        self,
        c: sa.Connection,
        transitions: Iterable[StepTransition],
        unwritten: set[str],
        counted: set[str],
        run_of: dict[str, str],
    ) -> set[str]:
        """Forget the deliveries this batch counted of steps it could not write: their
        transitions wait for a later batch, which counts them then."""
        back = {d for t in transitions if t.step_id in unwritten for d in t.delivery_ids}
        back &= counted
        if back:
            runs = sorted({run_of[t.step_id] for t in transitions if t.step_id in unwritten})
            c.execute(sql.batches.uncount_deliveries, {"run_ids": runs, "event_ids": sorted(back)})
        return back

    def _write_transitions(
        self,
        c: sa.Connection,
        transitions: Sequence[StepTransition],
        known: dict[str, Known],
        counted: set[str],
        later: Later,
    ) -> None:
        by_status: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
        for t in transitions:
            attempt = t.attempt if t.attempt is not None else known[t.step_id][0]
            # An event for "the current attempt" may name one another event of the
            # batch names too: the first of them is the one applying them in order keeps.
            by_status.setdefault(t.status, {}).setdefault(
                (t.step_id, attempt),
                {
                    "run_id": known[t.step_id][1],
                    "step_id": t.step_id,
                    "attempt_no": attempt,
                    "history_id": new_id(),
                    "now": t.at,
                    "scheduled_at": t.scheduled_at,
                    "running_at": t.running_at,
                    "ended_at": t.ended_at,
                    "result": t.result_json,
                    "error": t.error_json,
                    "task_id": t.task_id,
                    "worker": t.worker,
                    "pid": t.pid,
                    "eta": t.eta,
                    "reason": t.reason,
                    "deliveries": sum(1 for d in t.delivery_ids if d in counted),
                    # Failed for good: none remain, as a reader counting attempts sees it.
                    "retries": attempt - 1 if t.gave_up else t.retries,
                    "retry_delay": None if t.gave_up else _delay_text(t.retry_delay, t.step_id),
                    "run_day": known[t.step_id][3],
                },
            )
        # One transition per attempt, so the order between statuses does not
        # matter: each statement's guard decides alone whether it moves a row.
        for status, keyed in by_status.items():
            self._sql.write_transitions(c, status, list(keyed.values()), later)

    def _write_handovers(
        self,
        c: sa.Connection,
        handovers: Sequence[Handover],
        known: dict[str, Known],
    ) -> None:
        # After the transitions: the replaced attempt's own start is in the same batch
        # or an earlier one (one process journals both, in order).
        rows = [
            {
                "run_id": known[h.step_id][1],
                "step_id": h.step_id,
                "attempt_no": h.attempt,
                "replaced_by": h.replaced_by,
            }
            for h in handovers
        ]
        if rows:
            c.execute(sql.batches.hand_over_attempt, rows)

    def _write_outcomes(
        self,
        c: sa.Connection,
        outcomes: Sequence[RunOutcome],
        known: dict[str, Known],
        days: dict[str, dt.date | None],
        waiting: set[str],
        released: dict[str, dt.datetime],
        later: Later,
        own: frozenset[str] | None = None,
        elsewhere: Elsewhere | None = None,
    ) -> list[str]:
        """The runs these outcomes end, settled or completed; returns the runs to replay.
        A piece of a batch cut by key group (``own``: its runs) leaves the ends of other
        groups' runs to ``elsewhere``: one statement locks rows on one shard only."""
        complete = {run_id: at for run_id, at in released.items() if run_id not in waiting}
        settle: dict[str, dict[str, Any]] = {}
        replay: list[str] = []
        for o in outcomes:
            _, run_of_step, wire, _ = known[o.step_id]
            run_id = o.run_id or run_of_step
            if o.kind == "replay" or (o.run_id is None and run_kind(wire) == "workflow"):
                if run_id not in replay:
                    replay.append(run_id)
            elif o.kind == "complete":
                if run_id not in waiting:
                    complete[run_id] = max(o.at, complete.get(run_id, o.at))
            else:  # the first end of a run is the one that settles it
                settle.setdefault(
                    run_id,
                    {"run_id": run_id, "new_status": o.kind, "error": o.error_json, "now": o.at},
                )
        for row in self._unsent_bodies(c, outcomes, known, days, later):
            settle.setdefault(row["run_id"], row)
            complete.pop(row["run_id"], None)
        if own is not None and elsewhere is not None:
            elsewhere.waiting |= waiting
            for run_id in [r for r in complete if r not in own]:
                at = complete.pop(run_id)
                elsewhere.complete[run_id] = max(at, elsewhere.complete.get(run_id, at))
            for run_id in [r for r in settle if r not in own]:
                elsewhere.settle.setdefault(run_id, settle.pop(run_id))
        self._sql.write_outcomes(c, complete, list(settle.values()), later, days)
        return replay

    def _unsent_bodies(
        self,
        c: sa.Connection,
        outcomes: Sequence[RunOutcome],
        known: dict[str, Known],
        days: dict[str, dt.date | None],
        later: Later,
    ) -> list[dict[str, Any]]:
        """The runs held open by chords whose header task ended for good: Celery fails such
        a chord's body in its backend and never sends it, so each held run fails now.

        A chord no run holds yet (its other header tasks' publishes are still on their way)
        is held from now on by the failed task's own run, which has ended: a header task
        written later finds it held and holds nothing. Only a step that names its chord is
        looked up: any other end costs nothing more."""
        failed = {
            body: o
            for o in outcomes
            if o.kind in ("failed", "cancelled")
            for body in o.chord_bodies
        }
        if not failed:
            return []
        self._sql.send(c, later)  # it reads the steps the batch wrote
        held = c.execute(sql.batches.runs_held_by_unsent_bodies, {"body_ids": sorted(failed)})
        rows = []
        holders = {body: o.run_id or known[o.step_id][1] for body, o in failed.items()}
        unknown = sorted(set(holders.values()) - set(days))
        if unknown:  # a run an outcome names that the batch wrote nothing else of
            days.update(self._sql.known_runs(c, unknown))
        claims = [
            {"body_id": body, "run_id": run_id, "now": failed[body].at, "run_day": days.get(run_id)}
            for body, run_id in sorted(holders.items())
        ]
        for body_id, run_id, day in held.all():
            days[run_id] = day
            o = failed[body_id]
            error = {
                "type": "celery.exceptions.ChordError",
                "message": f"Header task {o.step_id} of this run's chord {o.kind} for good, so "
                f"Celery will not send the chord's body {body_id}: the run waited for it. Fix "
                "what the header task's error says, then publish the chord again.",
                "traceback": None,
                "step": None,
            }
            rows.append(
                {"run_id": run_id, "new_status": "failed", "error": json.dumps(error), "now": o.at}
            )
        self._db.run_many(c, self._open_chord, claims)
        return rows


def _joined(first: BatchResult, then: BatchResult) -> BatchResult:
    replay = (*first.replay, *(r for r in then.replay if r not in first.replay))
    return BatchResult(first.missing | then.missing, replay, (*first.fired, *then.fired))
