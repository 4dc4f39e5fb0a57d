"""Celery's view of each task and group (``backend="pikku://"``), beside the history.

Written by the mirror's batches (a task's result lands in the transaction of the
attempt it belongs to) or, in a process without a mirror, one write at a time; read
by the result backend. The values are Celery's own, encoded by the app's result
serializer: the store keeps them as bytes and never looks inside.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from pikku_celery.errors import Transient
from pikku_celery.store import sql
from pikku_celery.store.common import now
from pikku_celery.store.connector import Connector
from pikku_celery.store.mirror_batch import ChordWrite, FiredChord, ResultWrite
from pikku_celery.store.result_watch import CHANNEL, ResultWatch, Wakeups, notify_payload

__all__ = ["Results", "StoredResult"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A task's state and its meta as Celery encoded it."""

    status: str
    meta: bytes


class Results:
    """Reads and writes of ``pikku_celery_results`` and ``pikku_celery_groups``."""

    def __init__(self, db: Connector) -> None:
        self._db = db
        self._wakeups: Wakeups | None = None
        # Where the reaper's next look at chords not fired begins (``finish_due_chords``).
        self._due_after = ""

    def use_wakeups(self, wakeups: Wakeups) -> None:
        """Tell readers through ``wakeups`` from now on, instead of the database's NOTIFY
        (every process that writes or waits for results must use the same)."""
        self._wakeups = wakeups

    def write(
        self,
        rows: Sequence[ResultWrite],
        *,
        conn: sa.Connection | None = None,
        chords: Sequence[ChordWrite] = (),
    ) -> list[FiredChord]:
        """Write results forward only (see ``sql.results.write_result``) and the chords
        applied with them; returns the chords whose last header part is now written, to be
        fired once it is committed (given ``conn``, the caller commits, then calls
        :meth:`settle`).

        A chord is journaled by its publisher and its parts' results by the workers, so the
        results may be in SQL first: a chord is counted as it lands, too."""
        if not rows and not chords:
            return []
        with self._db.write(conn) as c:
            fired = self._write_counted(c, rows, chords)
        if conn is None:
            fired += self.settle([h.group_id for h in chords], _ready(rows))
        return fired

    def _write_counted(
        self, c: sa.Connection, rows: Sequence[ResultWrite], chords: Sequence[ChordWrite]
    ) -> list[FiredChord]:
        params = [
            {
                "task_id": r.task_id,
                "status": r.status,
                "attempt": r.attempt,
                "meta": r.meta,
                "date_done": r.date_done,
                "now": r.at,
            }
            for r in rows
        ]
        ready = _ready(rows)
        # One transaction: the chords and the results that count them land together.
        marks: dict[str, set[str]] = {}
        if chords:
            marks.update(self._apply_chords(c, chords))
            if not rows:
                return self._complete_chords(c, marks, chords[0].at)
        c.execute(self._db.sql.write_result, params)
        notify = self._db.sql.notify_ready
        if ready and notify is not None and self._wakeups is None:
            # Delivered at COMMIT, to the readers waiting for these ids (result_watch).
            c.execute(notify, {"channel": CHANNEL, "payload": notify_payload(ready)})
        if ready:
            # Each part of a chord these results complete is done from now on, whether its
            # chord is in SQL yet or not (a chord that lands later counts it as it lands).
            found = c.execute(sql.results.parts_waiting_for, {"task_ids": sorted(set(ready))})
            for group_id, task_id in found.all():
                marks.setdefault(group_id, set()).add(task_id)
        return self._complete_chords(c, marks, rows[0].at) if marks else []

    def settle(self, group_ids: Iterable[str], task_ids: Iterable[str]) -> list[FiredChord]:
        """After the COMMIT of a transaction that wrote chords (``group_ids``: applied or
        added to) or ready results (``task_ids``): mark the parts of those chords, and of
        the chords of those results, whose results are in and that no transaction marked,
        and claim those chords whose parts are now all done and that no batch claimed.

        A chord and its last part's result are written by different processes' batches
        (the publisher's, a worker's); two that run at once are each blind to the other's
        rows, so neither marks that part done nor claims the chord in its own transaction.
        Each looking again after its COMMIT, in a fresh snapshot, the later of the two to
        commit sees both and marks the part (whether the chord is done or not: later parts'
        batches count by the marks) and claims the chord when it is done: a chord fires
        within the flush lag whatever the order of the commits. With one writer at a time (SQLite),
        each transaction saw what the other had committed.

        A failure here is logged and leaves the chord to the reaper's pass: the batch is
        committed, and what it claimed must still be sent."""
        groups, ids = sorted(set(group_ids)), sorted(set(task_ids))
        if ids and self._wakeups is not None:
            self._announce(ids)
        if self._db.sql.one_writer or not (groups or ids):
            return []
        try:
            with self._db.read(None) as c:
                if ids:
                    found = c.execute(sql.results.unsettled_chords, {"task_ids": ids})
                    groups = sorted({*groups, *found.scalars().all()})
                due = self._due(c, groups) if groups else {}
            if not due:
                return []
            with self._db.write(None) as c:
                return self._complete_chords(c, due, now())
        except Exception as exc:
            # The database going away right after a COMMIT is an outage the rest of the
            # mirror already reports: one line, no traceback.
            logger.warning(
                "pikku-celery could not look again for chords to fire after a commit (%s); "
                "the reaper's pass fires them",
                exc,
                exc_info=not isinstance(exc, Transient),
                extra={"action": "chord_settle_failed"},
            )
            return []

    def _due(self, c: sa.Connection, groups: Sequence[str]) -> dict[str, set[str]]:
        """Of these chords not fired, those with parts to mark (not marked, their results
        ready now) or whose every waiting part is ready, each with the parts to mark.

        A part is marked even when its chord still waits for others: the batch of a later
        part counts by the marks, so one left unmarked would hold the chord until the
        reaper's pass."""
        waiting, ready = self._waiting(c, groups)
        return {
            group_id: tasks & ready
            for group_id, tasks in waiting.items()
            if tasks & ready or tasks <= ready
        }

    def _waiting(
        self, c: sa.Connection, groups: Sequence[str]
    ) -> tuple[dict[str, set[str]], set[str]]:
        """Of these chords, those not fired (in SQL), each with its parts not marked done, and
        which of those parts have a ready result: one read on the chords' own key, one of
        those results on theirs."""
        waiting: dict[str, set[str]] = {}
        rows = c.execute(sql.results.waiting_parts, {"group_ids": list(groups)}).all()
        for group_id, task_id in rows:
            tasks = waiting.setdefault(group_id, set())
            if task_id is not None:
                tasks.add(task_id)
        ids = sorted({task_id for _, task_id in rows if task_id is not None})
        if not ids:
            return waiting, set()
        return waiting, set(c.execute(sql.results.ready_results, {"task_ids": ids}).scalars())

    def _mark_due(self, c: sa.Connection, due: dict[str, set[str]]) -> None:
        for group_id in sorted(due):
            if due[group_id]:
                key = {"chord_id": group_id, "task_ids": sorted(due[group_id])}
                c.execute(sql.results.mark_done_among, key)

    def _announce(self, task_ids: Sequence[str]) -> None:
        assert self._wakeups is not None
        try:
            self._wakeups.announce(task_ids)
        except Exception as exc:
            # The results are committed: a reader that was not told still looks at least
            # every second (its watch says it cannot push while the way is down).
            logger.warning(
                "pikku-celery could not tell waiting readers of %d results (%s); they "
                "find them at their next look",
                len(task_ids),
                exc,
                extra={"action": "result_wakeup_failed"},
            )

    def _complete_chords(
        self, c: sa.Connection, marks: dict[str, set[str]], at: dt.datetime
    ) -> list[FiredChord]:
        """Mark the parts ``marks`` names done, chord by chord, and claim the firing of every
        one of these chords whose parts are now all done.

        The chords are locked one after another in ``group_id`` order, after every other
        lock of the batch, each right after its parts are marked (one statement where the
        dialect has it), and counted after the lock: of two batches that write a chord's
        last two parts at once, the second counts the first's committed part and fires.
        Each count reads the chord's own rows of parts.
        """
        fired: list[FiredChord] = []
        mark_and_lock = self._db.sql.mark_and_lock_chord
        for group_id in sorted(marks):
            key = {"chord_id": group_id}
            tasks = sorted(marks[group_id])
            if tasks and mark_and_lock is not None:
                chord = c.execute(mark_and_lock, {**key, "task_ids": tasks}).first()
            else:
                if tasks:
                    c.execute(sql.results.mark_done_among, {**key, "task_ids": tasks})
                chord = c.execute(sql.results.lock_chord, key).first()
            if chord is None or chord.fired_at is not None:
                continue
            if c.execute(sql.results.chord_parts_waiting, key).scalar_one():
                continue
            if c.execute(sql.results.claim_firing, {**key, "now": at}).rowcount:
                ids = c.execute(sql.results.part_ids, key).scalars().all()
                fired.append(FiredChord(group_id, bytes(chord.body), tuple(ids)))
        return fired

    def apply_chord(self, group_id: str, parts: Sequence[str], body: bytes) -> list[FiredChord]:
        """Keep a chord until its header parts are done (before any of them is published),
        in a process with no journal; returns it if its parts are already done."""
        return self.write([], chords=[ChordWrite(group_id, tuple(parts), body, now())])

    def _apply_chords(self, c: sa.Connection, chords: Sequence[ChordWrite]) -> dict[str, set[str]]:
        """The chords and their parts; returns, by chord, the parts to mark done: those whose
        results are in already (written before the chord landed, by other processes'
        batches)."""
        c.execute(
            self._db.sql.insert_chord,
            [
                {"group_id": h.group_id, "size": len(h.parts), "body": h.body, "now": h.at}
                for h in chords
            ],
        )
        parts = [
            {"group_id": h.group_id, "task_id": task_id, "position": position}
            for h in chords
            for position, task_id in enumerate(h.parts)
        ]
        if parts:
            c.execute(self._db.sql.insert_chord_parts, parts)
        waiting, ready = self._waiting(c, sorted({h.group_id for h in chords}))
        return {group_id: tasks & ready for group_id, tasks in waiting.items()}

    def add_to_chords(
        self, added: Sequence[tuple[str, str]], *, conn: sa.Connection | None = None
    ) -> None:
        """Tasks added to chords (``(group_id, task_id)``): each waits for one more part,
        whose result comes after the others'; a task added twice counts once. One whose
        result is in already (another process's batch wrote it first) is done."""
        if added:
            with self._db.write(conn) as c:
                new: dict[str, set[str]] = {}
                for group_id, task_id in added:
                    key = {"chord_id": group_id, "task_id": task_id}
                    if c.execute(self._db.sql.add_chord_part, key).first() is not None:
                        c.execute(sql.results.grow_chord, key)
                        new.setdefault(group_id, set()).add(task_id)
                ids = sorted({task_id for tasks in new.values() for task_id in tasks})
                if ids:
                    ready = set(c.execute(sql.results.ready_results, {"task_ids": ids}).scalars())
                    self._mark_due(c, {g: tasks & ready for g, tasks in new.items()})

    def mark_sent(
        self, sent: Sequence[tuple[str, dt.datetime]], *, conn: sa.Connection | None = None
    ) -> None:
        """The bodies of these chords are out (``(group_id, when)``): never sent again."""
        if sent:
            with self._db.write(conn) as c:
                rows = [{"chord_id": group_id, "now": at} for group_id, at in sent]
                c.execute(sql.results.mark_sent, rows)

    def finish_due_chords(self, before: dt.datetime, *, limit: int = 100) -> list[FiredChord]:
        """Claim the chords written before ``before`` whose parts are all done and that no
        batch fired (the chord and its last result landed at once, in two transactions,
        and the look after their COMMITs failed): ``limit`` chords not fired at a time,
        each pass going on from where the last one ended."""
        with self._db.write(None) as c:
            params = {"before": before, "limit": limit, "after": self._due_after}
            open_ = c.execute(sql.results.open_chords, params).scalars().all()
            self._due_after = open_[-1] if len(open_) >= limit else ""
            if not open_:
                return []
            due = self._due(c, open_)
            return self._complete_chords(c, due, now()) if due else []

    def unsent_chords(self, before: dt.datetime, *, limit: int = 100) -> list[FiredChord]:
        """Chords fired before ``before`` whose bodies were never said to be sent (the
        process that fired one died between its COMMIT and the publish)."""
        with self._db.read(None) as c:
            rows = c.execute(sql.results.unsent_chords, {"before": before, "limit": limit})
            chords = []
            for group_id, body in rows.all():
                ids = c.execute(sql.results.part_ids, {"chord_id": group_id}).scalars().all()
                chords.append(FiredChord(group_id, bytes(body), tuple(ids)))
        return chords

    def watch(self, task_ids: Iterable[str]) -> ResultWatch:
        """What a reader waits on between two reads of ``task_ids``' results."""
        if self._wakeups is not None:
            return self._wakeups.watch(task_ids)
        return self._db.sql.watch_results(self._db.engine, task_ids)

    def get(self, task_id: str, *, conn: sa.Connection | None = None) -> StoredResult | None:
        with self._db.read(conn) as c:
            row = c.execute(sql.results.get_result, {"task_id": task_id}).first()
        return None if row is None else StoredResult(row.status, bytes(row.meta))

    def get_many(
        self, task_ids: Iterable[str], *, conn: sa.Connection | None = None
    ) -> dict[str, StoredResult]:
        ids = sorted(set(task_ids))
        if not ids:
            return {}
        with self._db.read(conn) as c:
            rows = c.execute(sql.results.get_results, {"task_ids": ids}).all()
        return {row.task_id: StoredResult(row.status, bytes(row.meta)) for row in rows}

    def forget(self, task_id: str, *, conn: sa.Connection | None = None) -> bool:
        with self._db.single(conn) as c:
            return bool(c.execute(sql.results.delete_result, {"task_id": task_id}).rowcount)

    def save_group(self, group_id: str, meta: bytes) -> None:
        with self._db.single(None) as c:
            c.execute(self._db.sql.save_group, {"group_id": group_id, "meta": meta, "now": now()})

    def get_group(self, group_id: str) -> bytes | None:
        with self._db.read(None) as c:
            row = c.execute(sql.results.get_group, {"group_id": group_id}).first()
        return None if row is None else bytes(row.meta)

    def delete_group(self, group_id: str) -> bool:
        with self._db.single(None) as c:
            return bool(c.execute(sql.results.delete_group, {"group_id": group_id}).rowcount)

    def expire(self, before: dt.datetime, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` results and as many groups last written before ``before``;
        returns how many went (call again while it is ``limit`` or more)."""
        params = {"before": before, "limit": limit}
        with self._db.write(None) as c:
            gone = c.execute(self._db.sql.expire_results, params).rowcount
            gone += c.execute(self._db.sql.expire_groups, params).rowcount
            chords = c.execute(sql.results.expire_chords, params).rowcount
            if chords:
                c.execute(sql.results.expire_chord_parts)
            gone += chords
        return int(gone)


def _ready(rows: Sequence[ResultWrite]) -> list[str]:
    return [r.task_id for r in rows if r.status in sql.results.READY_STATES]
