"""A worker's own upkeep, in threads of its main process: recovery at start, and the reaper.

No beat is needed. Every worker runs a reaper pass every ``interval``
seconds (``app.conf.pikku_reaper_interval``; 0 turns it off), and a lease in
SQL makes that one pass per cluster at a time, about once per interval
however many workers there are. At start a worker first writes the journals
that dead processes on its machine left (so no attempt whose end is on disk
is taken for lost), then runs a pass at once (a restarted worker's lost
workflow steps go on within seconds) while another thread recovers durable
workflow runs, none of it holding up the worker itself.

Recovery is shared the same way: a starting worker needs one recovery pass
that began after it started. If one is running, it waits for that pass to
end and then looks: a pass begun since (another waiter's) covers it, else it
runs one itself. Three workers starting at once therefore replay each run
once, twice at most when one started while an earlier pass was going.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Final

from pikku_celery.errors import SchemaNotCurrent
from pikku_celery.integration.reaper import Reaper, ReapReport
from pikku_celery.mirror import Recorder

__all__ = [
    "ENV_REAPER_INTERVAL",
    "ENV_RETENTION_DAYS",
    "PARTITIONS_EVERY",
    "REAPER_INTERVAL",
    "Recover",
    "Upkeep",
]

logger = logging.getLogger(__name__)

ENV_REAPER_INTERVAL: Final = "PIKKU_REAPER_INTERVAL"
REAPER_INTERVAL: Final = 10.0
ENV_RETENTION_DAYS: Final = "PIKKU_RETENTION_DAYS"
#: Seconds between two passes over the day partitions by one worker: days change slowly,
#: and partitions are made two days ahead.
PARTITIONS_EVERY: Final = 300.0
#: Renewed after every page of runs: a recovering worker that dies frees it this soon.
_RECOVERY_LEASE: Final = 10.0
_POLL: Final = 0.5
_RETRY_RECOVERY: Final = 5.0
# Seconds between two log lines about tables that are missing or behind.
_SCHEMA_LOG_EVERY: Final = 60.0

#: Replays unsettled runs; calls its argument after every page, and stops when it says False.
Recover = Callable[[Callable[[], bool]], int]


class Upkeep:
    def __init__(
        self,
        mirror: Recorder,
        reaper: Callable[[], Reaper],
        *,
        holder: str,
        interval: float = REAPER_INTERVAL,
        recover: Recover | None = None,
        recovery_lease: str = "recovery",
        expire: Callable[[], object] | None = None,
        partitions: Callable[[], object] | None = None,
    ) -> None:
        self.mirror = mirror
        self._expire = expire
        self._partitions = partitions
        self._partitions_kept_at: float | None = None
        self._reaper = reaper
        self.holder = f"{holder}:{os.getpid()}"
        self.interval = interval
        self._recover = recover
        self.recovery_lease = recovery_lease
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._began: float | None = None
        self._made_reaper: Reaper | None = None  # one for every pass: it keeps what it looked up
        self._schema_logged_at = -_SCHEMA_LOG_EVERY

    def note_start(self) -> None:
        """When the worker process starts: any recovery pass begun after now covers it.

        Only the local monotonic clock is read here, before the pool forks: no
        connection is made that the pool processes would inherit.
        """
        if self._began is None:
            self._began = time.monotonic()

    def started(self) -> float:
        """When this worker started, on the leases' clock: now there, less how long ago here."""
        began = self._began if self._began is not None else time.monotonic()
        return self.mirror.store.leases.lease_clock() - (time.monotonic() - began)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="pikku-upkeep", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        self._guarded("adopt the journals of processes that are gone", self.mirror.adopt_orphans)
        if self._recover is not None:
            # Its own thread: waiting for a pass that a dead worker held must never
            # hold up the reaper's passes.
            threading.Thread(
                target=self._recover_until_done, name="pikku-recovery", daemon=True
            ).start()
        if self.interval > 0:
            # A new worker looks at once, even while the last pass rests.
            self._guarded("run the reaper", lambda: self.reap_once(at_start=True))
        while self.interval > 0 and not self._stop.wait(self.interval):
            self._guarded("run the reaper", self.reap_once)

    def _guarded(self, what: str, job: Callable[[], object]) -> bool:
        try:
            job()
        except SchemaNotCurrent as exc:
            # One line, now and then: the fix is a command, not a traceback to read.
            now = time.monotonic()
            if now - self._schema_logged_at >= _SCHEMA_LOG_EVERY:
                self._schema_logged_at = now
                logger.warning(
                    "pikku-celery could not %s: %s",
                    what,
                    exc,
                    extra={"action": "upkeep_schema_behind"},
                )
            return False
        except Exception:
            logger.exception(
                "pikku-celery could not %s; it tries again in a few seconds",
                what,
                extra={"action": "upkeep_failed"},
            )
            return False
        return True

    def _recover_until_done(self) -> None:
        """Recovery, tried again while it fails (the database away when the worker started)."""
        failed = False
        while not self._stop.is_set():
            if self._guarded("recover workflow runs", functools.partial(self._recover_now, failed)):
                return
            failed = True
            self._stop.wait(_RETRY_RECOVERY)

    def _recover_now(self, after_failure: bool) -> None:
        # After a failure only a pass begun from now on counts: the failed one covered nothing.
        self.recover_once(self.mirror.store.leases.lease_clock() if after_failure else None)

    # --- the reaper ------------------------------------------------------------------

    def reap_once(self, *, at_start: bool = False) -> ReapReport | None:
        """One pass if this worker gets the cluster's turn; None when another has it."""
        store = self.mirror.store
        if self._made_reaper is None:
            self._made_reaper = self._reaper()
        reaper = self._made_reaper
        # A holder that dies mid-pass blocks the others for about one interval at most.
        ttl = max(self.interval * 0.9, reaper.reply_timeout + 1.0)
        taken = store.leases.take_lease("reaper", self.holder, ttl, over_resting=at_start)
        if taken is None:
            return None
        begun = time.monotonic()
        try:
            report = reaper.reap()
            if self._expire is not None:
                # One small step per pass (a cluster's worth, under the same lease).
                self._guarded("expire results", self._expire)
            if self._partitions is not None and self._partitions_due():
                self._guarded("keep the day partitions", self._partitions)
            return report
        finally:
            # Rests for the rest of the interval: one pass per interval, cluster-wide.
            rest = max(0.0, self.interval * 0.9 - (time.monotonic() - begun))
            store.leases.release_lease("reaper", self.holder, taken, hold=rest)

    def _partitions_due(self) -> bool:
        now = time.monotonic()
        if self._partitions_kept_at is not None and now - self._partitions_kept_at < (
            PARTITIONS_EVERY
        ):
            return False
        self._partitions_kept_at = now
        return True

    # --- recovery --------------------------------------------------------------------

    def recover_once(self, started: float | None = None) -> bool:
        """Make sure a recovery pass begins after this worker started; True if this ran it.

        ``started``: when the worker started, on the leases' clock (else :meth:`started`).
        """
        assert self._recover is not None
        store = self.mirror.store
        since = self.started() if started is None else started
        while not self._stop.is_set():
            # Taken only if no pass began since this worker started: one that did covers
            # this worker, even when it has ended by now.
            taken = store.leases.take_lease(
                self.recovery_lease, self.holder, _RECOVERY_LEASE, if_taken_before=since
            )
            if taken is not None:
                try:
                    count = self._recover(functools.partial(self._renew_recovery, taken))
                finally:
                    store.leases.release_lease(self.recovery_lease, self.holder, taken)
                logger.info(
                    "pikku-celery recovery replayed %d unsettled workflow runs",
                    count,
                    extra={"action": "workflow_recovery", "runs": count},
                )
                return True
            last = store.leases.lease_taken_at(self.recovery_lease)
            if last is not None and last >= since:
                return False  # a pass that began after this worker started covers it
            self._stop.wait(_POLL)
        return False

    def _renew_recovery(self, generation: int) -> bool:
        return self.mirror.store.leases.renew_lease(
            self.recovery_lease, self.holder, generation, _RECOVERY_LEASE
        )
