"""Journals of other processes: those left by processes that are gone, to adopt, and
what every journal in a folder holds, read without their locks (for the reaper, the
CLI and the metrics).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator
from pathlib import Path

from pikku_celery.mirror.journal.aside import read_set_aside
from pikku_celery.mirror.journal.checkpoint import Checkpoint, Spans
from pikku_celery.mirror.journal.core import Journal
from pikku_celery.mirror.journal.folders import HOSTED_SUFFIX, SUFFIX
from pikku_celery.mirror.journal.locks import consumer_alive, owner_alive
from pikku_celery.mirror.journal.segments import JournalTail

__all__ = ["journal_depth", "journaled_steps", "orphaned_journals", "unserved_journals"]

logger = logging.getLogger(__name__)


def orphaned_journals(folder: Path, database: str | None = None) -> Iterator[Journal]:
    """Journals left by processes that are gone, each opened (and locked) for adoption.

    ``database``: only journals of that database (its :func:`database_key`); one that
    says it is for another database is left where it is, with a warning.
    """
    if not folder.is_dir():
        return
    wanted = database
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        if not path.is_dir():
            continue  # not a journal: each one is a folder of segments
        try:
            journal = Journal(path, existing=True)
        except OSError:
            continue  # its process is alive, or another process adopted it first
        own = journal.database
        if wanted is not None and own is not None and own != wanted:
            logger.warning(
                "pikku-celery leaves journal %s alone: it holds events for %s, not %s",
                path,
                own,
                wanted,
                extra={"action": "journal_of_another_database", "journal": str(path)},
            )
            journal.close(delete_if_empty=False)
            continue
        yield journal


def _waiting_events(path: Path) -> Iterator[tuple[str, str]]:
    """``(kind, payload)`` of each event waiting in a journal, restored ones last.

    What has left may still be read here until the owner's checkpoint says so: an
    event counts as waiting a moment longer, never less."""
    checkpoint = Checkpoint.read(path)
    aside = read_set_aside(path)
    skip = Spans(checkpoint.removed)
    tail = JournalTail(path, checkpoint.low)
    try:
        while batch := tail.read(4096):
            for seq, kind, payload in batch:
                if seq not in skip and seq not in aside:
                    yield kind, payload
    finally:
        tail.close()
    for entry in aside.values():
        if entry.restored:
            yield entry.kind, entry.payload


def journal_depth(root: Path, *, only: str = "*", table: str = "events") -> int:
    """Events waiting in every journal under ``root`` (or its database folder ``only``).

    ``table="set_aside"`` counts the events set aside instead.
    """
    if table not in ("events", "set_aside"):
        raise ValueError("table is 'events' or 'set_aside'")
    total = 0
    if not root.is_dir():
        return 0
    for path in root.glob(f"{only}/*{SUFFIX}"):
        try:
            if table == "set_aside":
                total += sum(1 for a in read_set_aside(path).values() if not a.restored)
            else:
                total += sum(1 for _ in _waiting_events(path))
        except OSError:
            continue  # being deleted right now, or not a journal
    return total


def unserved_journals(root: Path, *, only: str = "*") -> int:
    """Hosted journals under ``root`` (or its database folder ``only``) whose publisher
    lives and which no process consumes: their events wait for a node's flusher."""
    return sum(
        1
        for path in root.glob(f"{only}/*{HOSTED_SUFFIX}")
        if path.is_dir() and owner_alive(path) and not consumer_alive(path)
    )


def journaled_steps(folder: Path, step_ids: Collection[str]) -> set[str]:
    """Which of ``step_ids`` have events waiting (or set aside) in a journal of ``folder``.

    Read-only and without the journals' locks: what a live process holds in
    its journal is exactly what it has not written to SQL yet.
    """
    wanted = set(step_ids)
    found: set[str] = set()
    if not wanted or not folder.is_dir():
        return found
    for path in folder.glob(f"*{SUFFIX}"):
        try:
            # Set-aside events count too: an attempt whose outcome is known on this
            # machine but could not be written is not lost, and its task must not be
            # sent again.
            payloads = [p for _, p in _waiting_events(path)]
            payloads += [a.payload for a in read_set_aside(path).values() if not a.restored]
        except OSError:
            continue  # being deleted right now: its events are in SQL
        for payload in payloads:
            step_id = _step_id(payload)
            if step_id in wanted:
                found.add(step_id)
    return found


def _step_id(payload: str) -> str | None:
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    step_id = data.get("step_id") if isinstance(data, dict) else None
    return step_id if isinstance(step_id, str) else None
