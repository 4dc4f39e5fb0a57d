"""A worker node's journals: its pool processes only append, its main process writes them.

A worker's main process serves its node (its sink is a ``NodeSink``): the pool
processes it forks afterwards append to journals of their own and run no
flusher. The main process's flusher claims every journal in the folder that no
process consumes (its consumer lock is free): its children's at once (their
names end with its pid, see ``node_suffix``), hosted publishers' (a web app's,
see ``HOSTED_SUFFIX``: any node of the machine writes them) while they live,
and those of processes that are gone (a node served before it that died, say).
It reads them while they grow and writes them with its own in shared batches. A
journal whose owner has ended is deleted once it is empty; one whose owner lives when
it is let go (the main process stops first) is claimed by the next node once that
owner is gone (a hosted one while it lives too).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pikku_celery.mirror.journal import HOSTED_SUFFIX, SUFFIX, Journal, node_suffix, owner_alive

__all__ = ["NodeJournals"]

logger = logging.getLogger(__name__)


class NodeJournals:
    """The journals this process consumes besides its own.

    ``own``: this process's journal (never claimed: it is written already);
    ``forget``: told of a journal that is gone. A journal that could not be
    claimed is looked at again after ``retry_after`` seconds; a new one at once.
    """

    def __init__(
        self,
        folder: Path,
        database: str,
        own: Callable[[], Journal | None],
        forget: Callable[[Journal], None],
        *,
        retry_after: float,
    ) -> None:
        self._folder = folder
        self._database = database
        self._own = own
        self._forget = forget
        self.retry_after = retry_after
        self._held: dict[str, Journal] = {}
        self._refused: dict[str, float] = {}  # name -> when it could not be claimed
        self._swept = 0.0
        # The flusher thread and a caller that must see the node written (the backend,
        # for a dead pool process) both refresh.
        self._lock = threading.RLock()

    def journals(self) -> list[Journal]:
        with self._lock:
            return list(self._held.values())

    def refresh(self) -> list[Journal]:
        """Claim the journals no process consumes; returns every journal held."""
        with self._lock:
            return self._refresh()

    def _refresh(self) -> list[Journal]:
        folder = self._folder
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return self.journals()
        own = self._own()
        own_name = None if own is None else own.path.name
        children = node_suffix(os.getpid())
        now = time.monotonic()
        for name in names:
            if not name.endswith(SUFFIX) or name == own_name or name in self._held:
                continue
            child = name.endswith(children)
            refused = self._refused.get(name)
            if not child and refused is not None and now - refused < self.retry_after:
                continue
            # Another node's pool process (two workers on one machine) is its node's to
            # write while it lives: its main process answers for what it journaled. A
            # hosted publisher's is whichever node's claims it first.
            journal = self._claim(folder / name, child, name.endswith(HOSTED_SUFFIX))
            if journal is None:
                self._refused[name] = now
            else:
                self._refused.pop(name, None)
                self._held[name] = journal
        if len(self._refused) > 4 * len(names) + 64:  # names that are long gone
            present = set(names)
            self._refused = {n: t for n, t in self._refused.items() if n in present}
        return self.journals()

    def _claim(self, path: Path, child: bool, hosted: bool) -> Journal | None:
        if not path.is_dir():
            return None  # not a journal: a journal is a folder of segments
        living = child or hosted  # claimed while its owner lives
        if not living and owner_alive(path):
            return None  # another node's, alive: opening it would read it all for nothing
        try:
            journal = Journal(path, role="consume")
        except OSError:
            return None  # its owner writes it, or another node's flusher does
        own, wanted = journal.database, self._database
        if own is not None and own != wanted:
            journal.close(delete_if_empty=False)
            return None  # another database's: adoption says so in the log
        ended = journal.owner_gone()
        if not (living or ended):
            journal.close(delete_if_empty=False)
            return None
        if ended and (depth := journal.depth()):
            logger.warning(
                "pikku-celery writes %d mirror events left in %s by a process that ended",
                depth,
                path,
                extra={"action": "journal_adopted", "count": depth},
            )
        return journal

    def run_when_due(self) -> None:
        """Delete the emptied journals of owners that ended (once per ``retry_after``): one
        of the node flusher's chores."""
        with self._lock:
            now = time.monotonic()
            if now - self._swept < self.retry_after:
                return
            self._swept = now
            for name, journal in list(self._held.items()):
                if journal.owner_gone() and journal.next_due() is None:
                    self._let_go(name, journal)

    def _let_go(self, name: str, journal: Journal) -> None:
        del self._held[name]
        self._forget(journal)
        try:
            journal.close()  # deleted if empty and its owner is gone
        except OSError:
            logger.exception(
                "pikku-celery could not let journal %s go",
                journal.path,
                extra={"action": "journal_release_failed"},
            )

    def close(self) -> None:
        """Let every journal go: those of ended owners, if empty, are deleted; the others
        stay for whichever process claims them next."""
        with self._lock:
            for name, journal in list(self._held.items()):
                with contextlib.suppress(OSError):
                    journal.owner_gone()
                self._let_go(name, journal)
