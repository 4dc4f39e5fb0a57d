"""The flusher: one thread per process and mirror, writing journals in group commits.

It writes its process's journal and, in a worker's main process, the journals of
the node's pool processes (looked at every interval: they only append).

Batches start at most once every ``flush_interval`` seconds (a full batch is
followed by the next at once): the first event of a group waits for the others
of its interval, which is what makes one commit serve many events. While the
database is away the thread backs off, doubling its wait up to two seconds.
Between batches it does its chores (``chores``: adopting the journals of
processes that are gone, pruning the delivery ledger), each when it is due.
It never dies of an error: what it could not write stays on disk.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final

from pikku_celery.mirror.chores import Chore, run_chores
from pikku_celery.mirror.deferral import RETRY_FIRST, RETRY_MOST
from pikku_celery.mirror.journal import Journal
from pikku_celery.mirror.outage import Outage

__all__ = ["ENV_FLUSH_INTERVAL", "FLUSH_INTERVAL", "Flusher"]

logger = logging.getLogger(__name__)

# Chosen from bench.throughput on 2 cores: at 20 ms a prefork -c 2 worker made 0.40
# commits per no-op task (lag p99 110 ms), at 40 ms 0.13 (p99 about 100 ms); a batch costs
# about 1 ms of Python however small, so fewer, larger ones leave more CPU to the tasks.
FLUSH_INTERVAL: Final = 0.04
ENV_FLUSH_INTERVAL: Final = "PIKKU_FLUSH_INTERVAL"
# A pass that wrote at most this many events found the process nearly idle (a task or two
# per interval): a result a reader waits for is then written at once, whenever the last
# batch was. A busier process gathers for the interval, one commit for many events.
SMALL_PASS: Final = 8


class Flusher:
    """The thread that writes ``journals()`` with ``flush_journals`` whenever one is due.

    ``journals()``: this process's journal first, then those it consumes for its node
    (None: the thread ends); ``flush_journals``: how many events a pass wrote (None: the
    database is away); ``poll``: other processes append to some of them, which
    no :meth:`wake` tells, so they are looked at every interval. :meth:`wake` on every
    append; :meth:`start` and :meth:`halt` are called under the owner's lock,
    :meth:`join` after it is released.
    """

    def __init__(
        self,
        journals: Callable[[], Sequence[Journal] | None],
        flush_journals: Callable[[Sequence[Journal]], int | None],
        *,
        poll: Callable[[], bool] = lambda: False,
        outage: Outage,
        chores: Sequence[Chore],
        flush_interval: float,
        adopt_interval: float,
    ) -> None:
        self._journals = journals
        self._flush_journals = flush_journals
        self._poll = poll
        self._outage = outage
        self._chores = chores
        self.flush_interval = flush_interval
        self.adopt_interval = adopt_interval
        self._wake = threading.Event()
        self._stop = threading.Event()  # halt(): the thread stops waiting at once
        # Set by an event a reader waits for (a result), and by halt(): no gathering wait.
        self._hurry = threading.Event()
        self._thread: threading.Thread | None = None
        self._closing = False

    def wake(self, *, at_once: bool = False) -> None:
        """An event was appended: a flush is due within the interval, or as soon as no
        batch was written within the last one (``at_once``: a reader waits for it)."""
        if at_once and not self._hurry.is_set():
            self._hurry.set()
        if not self._wake.is_set():
            self._wake.set()

    def start(self) -> bool:
        """Run the thread unless it runs already; True when a new one started."""
        if self._thread is not None and self._thread.is_alive():
            return False
        self._closing = False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pikku-celery-flusher", daemon=True)
        self._thread.start()
        return True

    def halt(self) -> threading.Thread | None:
        """Tell the thread to stop after its batch in flight; returns it, for :meth:`join`."""
        self._closing = True
        thread, self._thread = self._thread, None
        return thread

    def join(self, thread: threading.Thread | None, timeout: float) -> None:
        """Wake a halted thread and wait up to ``timeout`` for it to end."""
        self._stop.set()
        self._hurry.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        delay = RETRY_FIRST
        last = 0.0
        small = True  # the last pass wrote few events, if any
        while not self._closing:
            self._wake.clear()  # before reading the journals: a later append wakes us
            journals = self._journals()
            if journals is None:
                return
            due = _earliest(journals)
            now = time.time()
            # Batches start at most once per interval (a longer one while the
            # database is away): that is what makes a commit serve many events.
            gap = last + (delay if self._outage.ongoing else self.flush_interval) - now
            events = due is not None and due <= now
            if events:
                if gap > 0:
                    # Appended while the last pass wrote: after a small pass, a result a
                    # reader waits for need not wait out the interval.
                    (self._hurry if small else self._stop).wait(gap)
            else:
                timeout = (
                    self.adopt_interval if due is None else min(due - now, self.adopt_interval)
                )
                polling = self._poll()
                if polling:
                    timeout = min(timeout, max(gap, self.flush_interval))
                woken = self._wake.wait(timeout)
                if not woken and polling:
                    # What other processes appended over the interval: gathered already.
                    due = _earliest(journals)
                    events = due is not None and due <= time.time()
                else:
                    events = woken
                if woken and not self._closing:
                    # The first event of a group: let the others of this interval join
                    # it, unless a reader waits for one (a result) after an idle spell.
                    idle = small or time.time() - last >= self.flush_interval
                    if not (idle and self._hurry.is_set()):
                        waiter = self._hurry if idle else self._stop
                        waiter.wait(max(self.flush_interval, gap))
            self._hurry.clear()
            if self._closing:
                return
            if events:  # a pass that only looks for orphans is no batch to space out
                last = time.time()
            try:
                written = self._flush_journals(journals)
            except Exception:  # never let the thread die: the journal stays on disk
                logger.exception(
                    "pikku-celery could not write its journal %s; it stays on disk",
                    journals[0].path,
                    extra={"action": "journal_flush_failed"},
                )
                written = None
            ok = written is not None
            small = written is not None and written <= SMALL_PASS
            delay = RETRY_FIRST if ok else min(delay * 2, RETRY_MOST)
            if ok:
                run_chores(self._chores)


def _earliest(journals: Sequence[Journal]) -> float | None:
    """When the earliest event of any journal is due; None when none holds one."""
    dues = [due for journal in journals if (due := journal.next_due()) is not None]
    return min(dues) if dues else None
