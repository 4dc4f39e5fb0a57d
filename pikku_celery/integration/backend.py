"""Celery's result backend over the store: ``backend="pikku://"``.

One store instead of two: a task's result is one more mirror event, journaled in
the worker and written in the batch of the attempt it belongs to, so
``AsyncResult.state == "SUCCESS"`` only once SQL shows that attempt succeeded,
and a database outage never fails a task. Readers read committed SQL only.

URLs, through Celery's own parsing (``backend=`` or ``result_backend``):
``pikku://`` is the database of the ``PikkuCelery`` on the app (or, in a process
that only reads results, ``PIKKU_DATABASE_URL`` or the default); ``pikku+postgresql://...``
and ``pikku+sqlite:///...`` name a database. A URL naming another database than the
app's mirror is a ``ConfigurationError``.

Registered as the ``pikku`` entry point of ``celery.result_backends``.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, TypeVar

from celery import current_task, states
from celery.backends.base import BaseBackend
from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import result_from_tuple
from celery.utils.functional import _regen  # type: ignore[attr-defined]
from kombu.exceptions import EncodeError
from kombu.utils.encoding import bytes_to_str, ensure_bytes

from pikku_celery.errors import (
    ConfigurationError,
    PayloadTooLarge,
    StepNotFound,
    StoreError,
    Transient,
)
from pikku_celery.faults import crash_point
from pikku_celery.integration import replace
from pikku_celery.integration.chords import (
    SHAPE_OPTION,
    chord_parts,
    fire_chords,
    header_shape,
)
from pikku_celery.integration.generator_chords import LazyChords
from pikku_celery.integration.installed import Installed, installed_on
from pikku_celery.integration.result_sinks import Direct, Journaled, ResultSink
from pikku_celery.integration.wakeups import configure_wakeups
from pikku_celery.mirror import chord_applied, chord_extended, chord_sent, result_stored
from pikku_celery.store import (
    DEFAULT_DATABASE_URL,
    ENV_DATABASE_URL,
    FiredChord,
    ResultWatch,
    WorkflowStore,
    now,
    safe_url,
    same_database,
)

__all__ = [
    "EXPIRE_BATCH",
    "SCHEME",
    "AppChords",
    "PikkuBackend",
    "ResultTooLarge",
    "executed",
    "executing",
    "expire_results",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

SCHEME: Final = "pikku"
#: Results (and groups) deleted per statement when they expire: short transactions.
EXPIRE_BATCH: Final = 1000
# Written by the task's end, which the recorder hands on after the attempt's own end
# (``mirror/held_results.py``): a reader never sees SUCCESS before SQL shows the attempt
# succeeded.
_AFTER_THE_ATTEMPT: Final = frozenset({states.SUCCESS, states.FAILURE, states.RETRY})
# Set on a request by ``task_prerun``: its task's body runs in this process, and its
# ``task_postrun`` (which hands on a result no attempt's end did) follows.
_EXECUTING: Final = "pikku_executing"
# Waiting: look often at first (a task's end is in SQL within the flush lag), then
# at most every ``interval`` Celery was given.
_FIRST_LOOK: Final = 0.005
_BRISK_FOR: Final = 10.0
_BRISK_CAP: Final = 0.05
# A reader that is told of results still looks this often (a lost notification).
_TOLD_AT_LEAST: Final = 1.0
# A reader whose database is away looks again after this long, doubling up to the most.
_AWAY_FIRST: Final = 0.1
_AWAY_MOST: Final = 2.0
#: The app setting that turns the pushed wait off (``pikku_result_notify = False``).
NOTIFY_SETTING: Final = "pikku_result_notify"


class ResultTooLarge(EncodeError, PayloadTooLarge):
    """A task's result is larger than the store accepts; Celery fails the task with it."""


def _url_of(url: str | None) -> str | None:
    """The database URL inside a backend URL; None for ``pikku://`` (the app's own)."""
    if not url or url.rstrip("/") in (f"{SCHEME}:", f"{SCHEME}:/"):
        return None
    if url.startswith(f"{SCHEME}+"):
        return url[len(SCHEME) + 1 :]
    if url.startswith(f"{SCHEME}://"):
        raise ConfigurationError(
            f"The result backend URL {safe_url(url)!r} names no database; use 'pikku://' for "
            "the PikkuCelery's own, or 'pikku+postgresql://...' / 'pikku+sqlite:///...'."
        )
    return url  # Celery passes ``pikku+postgresql://x`` on as ``postgresql://x``


class PikkuBackend(BaseBackend):
    """Results in the pikku-celery store, written through the mirror's journal."""

    # Results outlive the worker (``worker_deduplicate_successful_tasks`` needs that).
    persistent = True
    supports_autoexpire = False
    # ``GroupResult.get()`` waits on every child in one query a look (``get_many``).
    supports_native_join = True
    # The meta is kept as the bytes Celery encoded, never looked into: compressed is fine.
    supports_result_compression = True
    # Set by Celery's Backend; named for the type checker, which has no stub of them.
    app: Any
    _ensure_not_eager: Callable[[], None]
    _get_result_meta: Callable[..., dict[str, Any]]
    _cache: Any

    def __init__(self, app: Any, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(app, url=url, **kwargs)
        # One backend per process, not per thread: the store's pool and the result
        # listener serve every thread (a web app's), so Celery may share it.
        self.thread_safe = True
        self._named = _url_of(url)
        self._lock = threading.Lock()
        self._lazy_chords = LazyChords()
        self._chosen: tuple[Installed | None, int, ResultSink] | None = None
        if installed_on(app) is not None:
            self._sink  # noqa: B018 - a URL naming another database than the mirror's fails now

    # --- the sink, chosen once --------------------------------------------------------

    @property
    def _sink(self) -> ResultSink:
        """Where results go: through the app's ``PikkuCelery`` when one is installed, else
        straight to a store of this process's own (a process that only reads or stores
        results: a web app calling ``AsyncResult.get()``). Chosen again only when another
        ``PikkuCelery`` is installed, or in a forked child (its own connections)."""
        pikku, pid = installed_on(self.app), os.getpid()
        chosen = self._chosen
        if chosen is not None and chosen[0] is pikku and chosen[1] == pid:
            return chosen[2]
        with self._lock:
            sink = self._choose(pikku, chosen)
            self._chosen = (pikku, pid, sink)
            return sink

    def _choose(
        self, pikku: Installed | None, before: tuple[Installed | None, int, ResultSink] | None
    ) -> ResultSink:
        if pikku is not None:
            self._check_same(pikku.mirror.store)
            return Journaled(pikku)
        if before is not None and before[0] is None and before[1] != os.getpid():
            before[2].store.dispose_after_fork()  # the parent's connections stay its own
        url = (
            self._named
            or self.app.conf.get("pikku_database_url")
            or os.environ.get(ENV_DATABASE_URL)
            or DEFAULT_DATABASE_URL
        )
        store = WorkflowStore(url)
        configure_wakeups(self.app.conf, store)
        return Direct(store, self.fire_chords)

    def _check_same(self, store: WorkflowStore) -> None:
        mirrored = store.engine.url.render_as_string(hide_password=False)
        if self._named is not None and not same_database(self._named, mirrored):
            raise ConfigurationError(
                f"The result backend names the database {safe_url(self._named)}, but this "
                f"app's PikkuCelery mirrors into {safe_url(mirrored)}; use "
                "backend='pikku://' for the same database, or give both the same URL."
            )

    @property
    def store(self) -> WorkflowStore:
        """The store results are in: the app's mirror's, or this process's own."""
        return self._sink.store

    # --- writes --------------------------------------------------------------------

    def _store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        meta = self._get_result_meta(
            result=result, state=state, traceback=traceback, request=request
        )
        meta["task_id"] = bytes_to_str(task_id)
        encoded = ensure_bytes(self.encode(meta))
        limit = self.store.codec.max_bytes
        if len(encoded) > limit:
            too_large = ResultTooLarge(
                f"The {state} result of task {task_id} is {len(encoded)} bytes encoded, over "
                f"the store's limit of {limit}: return a reference to the data (a key, a path) "
                "instead of the data itself, or raise the limit with the "
                "pikku_max_payload_bytes setting (app.conf.pikku_max_payload_bytes, or "
                "PIKKU_MAX_PAYLOAD_BYTES in the environment, in bytes)."
            )
            if state != states.FAILURE:
                # Celery fails a task whose result cannot be encoded (EncodeError): the task
                # ends FAILURE with this error, and nothing of the large value is written.
                raise too_large
            meta = self._get_result_meta(
                result=too_large, state=state, traceback=None, request=request
            )
            meta["task_id"] = bytes_to_str(task_id)
            encoded = ensure_bytes(self.encode(meta))
        event = result_stored(
            str(task_id), _attempt(request, task_id), state, encoded, _date(meta.get("date_done"))
        )
        self._sink.result(
            event,
            held=state in _AFTER_THE_ATTEMPT and _executing(request, task_id),
            in_task=_running(request, task_id) or bool(current_task),
        )
        return result

    # --- chords, finished here (no celery.chord_unlock) ------------------------------

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> None:
        """Keep the chord in SQL before its header is published; the batch that writes its
        last part's result fires it (``integration/chords.py``)."""
        self.ensure_chords_allowed()
        group_id, results = str(header_result_args[0]), header_result_args[1]
        if isinstance(results, _regen):
            # Read from a generator: kept as its tasks are sent (``generator_chords``).
            encoded = self._kept_body(body, None)
            self._lazy_chords.applied(
                group_id, functools.partial(self._keep, group_id, encoded=encoded)
            )
            return
        header = self.app.GroupResult(*header_result_args)
        self._keep(group_id, chord_parts(header), self._kept_body(body, header_shape(header)))

    def set_chord_size(self, group_id: str, chord_size: int) -> None:
        """Celery's count of a chord's parts, told before it sends the last: a chord whose
        header is a generator is kept once that one is published."""
        self._lazy_chords.sized(str(group_id), int(chord_size))

    def _kept_body(self, body: Any, shape: Any | None) -> bytes:
        """The body as the chord keeps it, with what its sending needs and the header
        tasks do not carry."""
        # A group replacing the running step: its body carries it on.
        replace.follow_chord_body(body, self._sink.step_name)
        kept: dict[str, Any] = {}
        if shape is not None:
            kept[SHAPE_OPTION] = shape
        parent = self.app.current_worker_task
        if not body.options.get("root_id") and parent is not None:
            # The header tasks are sent under this task's root, and the body, sent from
            # one of them, would be: it is sent from no task here, so it is told.
            kept["root_id"] = parent.request.root_id or parent.request.id
        if kept:
            # A copy: the header tasks carry the body as it is.
            body = body.clone()
            body.options.update(kept)
        return ensure_bytes(self.encode(body))

    def _keep(self, group_id: str, parts: Sequence[str], encoded: bytes) -> None:
        # Its parts may all be done already (the header was sent before, with this id):
        # the chord is counted as it lands, and fires then.
        self._sink.chord(chord_applied(group_id, parts, encoded))

    def add_to_chord(self, chord_id: str, result: Any) -> None:
        """``Task.add_to_chord``: the chord waits for one more part, recorded before that
        task is published and before the adding task's own result."""
        self._sink.chord(chord_extended(str(chord_id), str(result.id)))

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kwargs: Any) -> None:
        """Nothing: a part counts when its result is in SQL, in that result's transaction."""

    def fire_chords(self, chords: Sequence[FiredChord]) -> None:
        """Send the bodies of chords whose parts are all done (after their COMMIT), and
        note each as sent."""
        fire_chords(self, chords, self._sent)

    def _sent(self, group_id: str) -> None:
        self._sink.chord(chord_sent(group_id))

    def cleanup(self) -> None:
        """What Celery's ``celery.backend_cleanup`` (beat) calls: every expired result goes.

        The workers' own upkeep does the same in small steps without beat."""
        while expire_results(self.app, self.store) >= EXPIRE_BATCH:
            pass

    def _forget(self, task_id: str) -> None:
        self.store.results.forget(str(task_id))

    def _save_group(self, group_id: str, result: Any) -> Any:
        payload = ensure_bytes(self.encode({"result": result.as_tuple()}))
        self.store.results.save_group(str(group_id), payload)
        return result

    def _delete_group(self, group_id: str) -> None:
        self.store.results.delete_group(str(group_id))

    # --- reads ---------------------------------------------------------------------

    def _get_task_meta_for(self, task_id: str) -> dict[str, Any]:
        stored = self.store.results.get(str(task_id))
        if (stored is None or stored.status not in states.READY_STATES) and self._adopted():
            stored = self.store.results.get(str(task_id))
        if stored is None:
            return {"status": states.PENDING, "result": None}
        meta: dict[str, Any] = self.decode_result(stored.meta)
        return meta

    def _adopted(self) -> bool:
        """In a worker's main process, the journals of its dead pool processes written now.

        The main process asks whether a task whose pool process died had stored its
        success (Celery's ``Request.on_failure`` then records no failure): that success
        may still be in the dead process's journal, written within seconds by adoption.
        Only the main process does this, and only for a result not ready: it reads the
        journals of the processes that are gone first."""
        return self._sink.adopted()

    def _restore_group(self, group_id: str) -> dict[str, Any] | None:
        payload = self.store.results.get_group(str(group_id))
        if payload is None:
            return None
        meta: dict[str, Any] = self.decode(payload)
        meta["result"] = result_from_tuple(meta["result"], self.app)
        return meta

    def task_result_exists(self, task_id: str) -> bool:
        """True once the task has a result, or once the mirror recorded its publish."""
        if self.store.results.get(str(task_id)) is not None:
            return True
        try:
            self.store.get_step(str(task_id))
        except StepNotFound:
            return False
        return True

    def get_many(
        self,
        task_ids: Iterable[str],
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_message: Callable[[dict[str, Any]], object] | None = None,
        on_interval: Callable[[], object] | None = None,
        max_iterations: int | None = None,
        READY_STATES: frozenset[str] = states.READY_STATES,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each task's meta as soon as it is ready, in one query a look for all of them."""
        waiting = {str(task_id) for task_id in task_ids}
        for task_id in sorted(waiting):
            cached = self._cache.get(task_id)
            if cached is not None and cached["status"] in READY_STATES:
                waiting.discard(task_id)
                yield task_id, cached
        clock = _Clock(timeout, interval)
        with self._watch(waiting) as watch:
            yield from self._join(
                waiting, watch, clock, on_message, on_interval, max_iterations, READY_STATES
            )

    def _join(
        self,
        waiting: set[str],
        watch: ResultWatch,
        clock: _Clock,
        on_message: Callable[[dict[str, Any]], object] | None,
        on_interval: Callable[[], object] | None,
        max_iterations: int | None,
        READY_STATES: frozenset[str],
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """What ``get_many`` yields once the cached results are out."""
        looks = 0
        away = _Away()
        while waiting:
            found = away.look(lambda: self.store.results.get_many(waiting))
            for task_id, stored in sorted((found or {}).items()):
                if stored.status not in READY_STATES:
                    continue
                meta: dict[str, Any] = self.decode_result(stored.meta)
                if meta["status"] == states.SUCCESS:
                    self._cache[task_id] = meta
                waiting.discard(task_id)
                if on_message is not None:
                    on_message(meta)
                yield task_id, meta
            looks += 1
            if not waiting or (max_iterations and looks >= max_iterations):
                return
            nap = away.nap(clock, watch.pushes)
            if nap is None:
                raise CeleryTimeout(away.says(f"Operation timed out ({clock.timeout})", clock))
            watch.wait(nap)
            # After each wait, as Redis's wait does: a parent's error (a chord's failed
            # header task) is seen before a result that came meanwhile (its body's).
            if on_interval:
                away.look(on_interval)

    def wait_for(
        self,
        task_id: str,
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_interval: Any = None,
    ) -> dict[str, Any]:
        """Celery's wait, looking often while a result is likely soon: a task's end is in
        SQL a flush interval after it happened, not half a second."""
        self._ensure_not_eager()
        clock = _Clock(timeout, interval)
        away = _Away()
        waited = False
        with self._watch([task_id]) as watch:
            while True:
                meta = away.look(lambda: self.get_task_meta(task_id))
                if meta is not None and meta["status"] in states.READY_STATES:
                    if on_interval and not waited:
                        # Redis's wait looks at the parents at least once, even for a
                        # result that was ready at the first look: a chord's failed header
                        # task raises its own error whenever the caller came to get().
                        away.look(on_interval)
                    return meta
                waited = True
                nap = away.nap(clock, watch.pushes)
                if nap is None:
                    raise CeleryTimeout(away.says("The operation timed out.", clock))
                watch.wait(nap)
                # After each wait, as Redis's wait does: the parents are looked at once
                # more after the result came, so a chord's failed header task raises its
                # own error rather than the body's ChordError stored after it.
                if on_interval:
                    away.look(on_interval)

    def _watch(self, task_ids: Iterable[str]) -> ResultWatch:
        """Told when a result comes (``pikku_result_notify``, on by default), else a poll."""
        if not self.app.conf.get(NOTIFY_SETTING, True):
            return ResultWatch()
        return self.store.results.watch(task_ids)


class _Clock:
    """How long a reader waits before its next look; None once ``timeout`` has passed.

    Told of results (``pushed``), it looks again when told, and at least every
    second. Polling, it looks often at first, doubling from a few milliseconds (a
    result is in SQL a flush interval after its task ended), at most every
    ``interval`` after a while."""

    def __init__(self, timeout: float | None, interval: float) -> None:
        self.timeout = timeout
        self._interval = interval
        self._started = time.monotonic()
        self._nap = min(_FIRST_LOOK, interval)

    def nap(self, pushed: bool) -> float | None:
        if pushed:
            return self.pause(_TOLD_AT_LEAST)
        waited = time.monotonic() - self._started
        cap = _BRISK_CAP if waited < _BRISK_FOR else self._interval
        return self.pause(min(self._nap * 2, cap, self._interval), brisk=True)

    def pause(self, seconds: float, *, brisk: bool = False) -> float | None:
        """``seconds``, or what is left of the timeout; None once it has passed."""
        waited = time.monotonic() - self._started
        if self.timeout is not None and waited >= self.timeout:
            return None
        if brisk:
            self._nap = seconds
        return seconds if self.timeout is None else max(0.0, min(seconds, self.timeout - waited))


class _Away:
    """A reader's view of its database being away: it keeps waiting, looking again with
    backoff, until its own timeout, which then says why nothing came."""

    def __init__(self) -> None:
        self.error: StoreError | None = None
        self._pause = _AWAY_FIRST

    def look(self, read: Callable[[], _T]) -> _T | None:
        """``read()``, or None while the database cannot be reached."""
        try:
            value = read()
        except StoreError as exc:
            if not isinstance(exc, Transient):
                raise
            if self.error is None:
                logger.info(
                    "pikku-celery cannot read results (%s); waiting readers look again "
                    "until the database is back or their timeout ends",
                    exc,
                    extra={"action": "result_read_away"},
                )
            self.error = exc
            return None
        self.error, self._pause = None, _AWAY_FIRST
        return value

    def nap(self, clock: _Clock, pushed: bool) -> float | None:
        if self.error is None:
            return clock.nap(pushed)
        pause, self._pause = self._pause, min(self._pause * 2, _AWAY_MOST)
        return clock.pause(pause)

    def says(self, timed_out: str, clock: _Clock) -> str:
        """What a timeout says: the outage, when the last look could not read."""
        if self.error is None:
            return timed_out
        return (
            f"{timed_out} The result database was unreachable when the {clock.timeout:g} s "
            f"timeout ended: {self.error} Results are kept and read once it is back."
        )


class AppChords:
    """After COMMIT in the recorder's sink: the bodies of the chords its batch completed,
    sent by the app's result backend, which has to be this one (every process of an app
    is given the same result backend)."""

    def __init__(self, app: Any) -> None:
        self._app = app

    def __call__(self, chords: Sequence[FiredChord]) -> None:
        backend = self._app.backend
        if not isinstance(backend, PikkuBackend):
            logger.warning(
                "pikku-celery has chords %s to finish, but this app's result backend is %s, "
                "not pikku://; give every process of the app the same result backend",
                ", ".join(c.group_id for c in chords),
                type(backend).__name__,
                extra={"action": "chord_without_backend"},
            )
            return
        crash_point("before_chord_send", "batch")
        backend.fire_chords(chords)


def expire_results(app: Any, store: WorkflowStore, limit: int = EXPIRE_BATCH) -> int:
    """Delete up to ``limit`` results older than ``result_expires`` (Celery's setting; None
    keeps them for ever); returns how many went."""
    expires = app.conf.result_expires
    if expires is None:
        return 0
    keep = expires if isinstance(expires, dt.timedelta) else dt.timedelta(seconds=expires)
    return store.results.expire(now() - keep, limit=limit)


def executing(request: Any) -> None:
    """``task_prerun``: the task of ``request`` runs its body in this process now, and its
    ``task_postrun`` follows (:func:`executed`): the result its end stores waits for the
    attempt's end."""
    if request is not None:
        setattr(request, _EXECUTING, True)


def executed(request: Any) -> None:
    """``task_postrun``: the task of ``request`` has run."""
    if request is not None and getattr(request, _EXECUTING, False):
        delattr(request, _EXECUTING)


def _running(request: Any, task_id: str) -> bool:
    """``request`` is the task's own: the worker's main process and Celery's failure of a
    chain's later links pass one too, with no ``task_postrun`` to follow."""
    return request is not None and str(getattr(request, "id", "")) == str(task_id)


def _executing(request: Any, task_id: str) -> bool:
    """``request`` is of the task whose body runs here (its end's signals are to come)."""
    return _running(request, task_id) and bool(getattr(request, _EXECUTING, False))


def _attempt(request: Any, task_id: str) -> int | None:
    """The attempt that writes: ``retries + 1`` of the task's own request; None for a write
    made outside the task (a revoke from the worker's main process)."""
    if not _running(request, task_id) or not isinstance(getattr(request, "retries", None), int):
        return None
    return replace.attempt_of(request)


def _date(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)
    return None
