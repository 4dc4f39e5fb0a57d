"""Celery's view of each task and group (``backend="pikku://"``), beside the history.

Written by the mirror's batches (a task's result lands in the transaction of the
attempt it belongs to) or, in a process without a mirror, one write at a time; read
by the result backend. The values are Celery's own, encoded by the app's result
serializer: the store keeps them as bytes and never looks inside.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from pikku_celery.store import sql
from pikku_celery.store.common import now
from pikku_celery.store.connector import Connector, by_dialect
from pikku_celery.store.mirror_batch import FiredChord, ResultWrite
from pikku_celery.store.result_watch import CHANNEL, ResultWatch, notify_payload, watch_results

__all__ = ["Results", "StoredResult"]


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A task's state and its meta as Celery encoded it."""

    status: str
    meta: bytes


class Results:
    """Reads and writes of ``pikku_celery_results`` and ``pikku_celery_groups``."""

    def __init__(self, db: Connector) -> None:
        self._db = db
        self._write = sql.results.write_result(db.dialect)
        self._save_group = sql.results.save_group(db.dialect)
        self._lock_chord = sql.results.lock_chord(db.dialect)
        self._insert_chord = sql.results.insert_chord(db.dialect)
        self._insert_parts = sql.results.insert_chord_parts(db.dialect)
        # Readers waiting on PostgreSQL are told at COMMIT; SQLite's see data_version move.
        self._notify: sa.Executable | None = by_dialect(
            db.dialect, {"postgresql": sql.results.notify, "sqlite": None}
        )

    def write(
        self, rows: Sequence[ResultWrite], *, conn: sa.Connection | None = None
    ) -> list[FiredChord]:
        """Write results forward only (see ``sql.results.write_result``); returns the chords
        whose last header part this write completed, to be fired once it is committed."""
        if not rows:
            return []
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
        ready = [r.task_id for r in rows if r.status in sql.results.READY_STATES]
        with self._db.write(conn) as c:
            c.execute(self._write, params)
            if ready and self._notify is not None:
                # Delivered at COMMIT, to the readers waiting for these ids (result_watch).
                c.execute(self._notify, {"channel": CHANNEL, "payload": notify_payload(ready)})
            return self._complete_chords(c, ready, rows[0].at) if ready else []

    def _complete_chords(
        self, c: sa.Connection, ready: Sequence[str], at: dt.datetime
    ) -> list[FiredChord]:
        """Claim the firing of every chord of these parts whose parts are now all done.

        The chords are locked one after another in ``group_id`` order, after every other
        lock of the batch, and counted after the lock: of two batches that write a chord's
        last two parts at once, the second counts the first's committed part and fires.
        """
        fired: list[FiredChord] = []
        groups = c.execute(sql.results.chords_of_parts, {"task_ids": sorted(set(ready))})
        for group_id in groups.scalars().all():
            key = {"chord_id": group_id}
            chord = c.execute(self._lock_chord, key).first()
            if chord is None or chord.fired_at is not None:
                continue
            done = c.execute(sql.results.chord_parts_done, key).scalar_one()
            if done < chord.size:
                continue
            if c.execute(sql.results.claim_firing, {**key, "now": at}).rowcount:
                ids = c.execute(sql.results.part_ids, key).scalars().all()
                fired.append(FiredChord(group_id, bytes(chord.body), tuple(ids)))
        return fired

    def apply_chord(self, group_id: str, parts: Sequence[str], body: bytes) -> None:
        """Keep a chord until its header parts are done (before any of them is published)."""
        with self._db.write(None) as c:
            c.execute(
                self._insert_chord,
                {"group_id": group_id, "size": len(parts), "body": body, "now": now()},
            )
            if parts:
                c.execute(
                    self._insert_parts,
                    [
                        {"group_id": group_id, "task_id": task_id, "position": position}
                        for position, task_id in enumerate(parts)
                    ],
                )

    def watch(self, task_ids: Iterable[str]) -> ResultWatch:
        """What a reader waits on between two reads of ``task_ids``' results."""
        return watch_results(self._db.engine, task_ids)

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
            c.execute(self._save_group, {"group_id": group_id, "meta": meta, "now": now()})

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
            gone = c.execute(sql.results.expire_results, params).rowcount
            gone += c.execute(sql.results.expire_groups, params).rowcount
            chords = c.execute(sql.results.expire_chords, params).rowcount
            if chords:
                c.execute(sql.results.expire_chord_parts)
            gone += chords
        return int(gone)
