"""``PikkuCelery``: the SQL mirror and the workflow engine on a Celery app.

The one piece above both the integration and the workflows: it wires them
together and gives the signal handlers what they need of the workflows through
the interface the integration defines (``installed.Installed``).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any, TypedDict, TypeVar, overload

from celery import Celery
from celery.canvas import Signature

from pikku_celery.durations import format_duration, parse_duration
from pikku_celery.errors import ConfigurationError
from pikku_celery.integration import signals
from pikku_celery.integration.backend import SCHEME, PikkuBackend, expire_results
from pikku_celery.integration.chords import RESEND_AFTER, resume_chords
from pikku_celery.integration.reaper import Reaper, ReapReport
from pikku_celery.integration.selection import TaskSelection
from pikku_celery.integration.task import WorkflowTask, as_task_function
from pikku_celery.integration.upkeep import (
    ENV_REAPER_INTERVAL,
    ENV_RETENTION_DAYS,
    REAPER_INTERVAL,
    Upkeep,
)
from pikku_celery.integration.wakeups import configure_wakeups
from pikku_celery.mirror import ENV_FLUSH_INTERVAL, FLUSH_INTERVAL, PublisherJournal, Recorder
from pikku_celery.store import (
    DEFAULT_DATABASE_URL,
    ENV_DATABASE_URL,
    ENV_READ_DATABASE_URL,
    WorkflowStore,
)
from pikku_celery.workflows.definition import Workflow
from pikku_celery.workflows.engine import WorkflowEngine

__all__ = ["ENV_MAX_PAYLOAD_BYTES", "MAX_PAYLOAD_SETTING", "REAP_TASK", "PikkuCelery"]

logger = logging.getLogger(__name__)


#: The periodic task that runs one reaper pass (see :meth:`PikkuCelery.reap_every`).
REAP_TASK = "pikku_celery.reap"

F = TypeVar("F", bound=Callable[..., Any])

#: The largest value (result, input, output, state) the store takes, in bytes of JSON or
#: encoded result: the app setting, else the environment variable, else the store's 16 MiB.
MAX_PAYLOAD_SETTING = "pikku_max_payload_bytes"
ENV_MAX_PAYLOAD_BYTES = "PIKKU_MAX_PAYLOAD_BYTES"


class _StoreOptions(TypedDict, total=False):
    max_payload_bytes: int


def _max_payload_bytes(conf: Any) -> _StoreOptions:
    """``WorkflowStore``'s ``max_payload_bytes`` argument, when one is configured."""
    configured = conf.get(MAX_PAYLOAD_SETTING)
    if configured is None or configured == "":
        configured = os.environ.get(ENV_MAX_PAYLOAD_BYTES)
    if configured is None or configured == "":
        return {}
    try:
        limit = int(configured)
    except (TypeError, ValueError):
        limit = 0
    if isinstance(configured, bool) or limit <= 0:
        raise ConfigurationError(
            f"{MAX_PAYLOAD_SETTING} ({ENV_MAX_PAYLOAD_BYTES}) is a number of bytes "
            f"(33554432 for 32 MiB), not {configured!r}."
        )
    return {"max_payload_bytes": limit}


#: Who writes a publisher's journal (see ``docs/operations/deployment.md``).
PUBLISHER_JOURNAL_SETTING = "pikku_publisher_journal"
ENV_PUBLISHER_JOURNAL = "PIKKU_PUBLISHER_JOURNAL"


def _publisher_journal(conf: Any, given: str | None) -> PublisherJournal:
    """``"own"`` (its own flusher thread) or ``"node"`` (a node's flusher on its machine)."""
    configured = (
        given
        or conf.get(PUBLISHER_JOURNAL_SETTING)
        or os.environ.get(ENV_PUBLISHER_JOURNAL)
        or "own"
    )
    value = str(configured).strip().lower()
    if value == "own":
        return "own"
    if value == "node":
        return "node"
    raise ConfigurationError(
        f'{PUBLISHER_JOURNAL_SETTING} ({ENV_PUBLISHER_JOURNAL}) is "own" (this process '
        'writes its journal from a flusher thread of its own) or "node" (a worker or '
        f"`pikku-celery flusher` on this machine writes it), not {configured!r}."
    )


class PikkuCelery:
    """Mirrors every step, transition and retry attempt of a Celery app's workflow tasks.

    The database URL comes from the argument, else ``app.conf.pikku_database_url``,
    else ``PIKKU_DATABASE_URL``, else ``sqlite:///pikku.db``. Nothing connects
    until the first event; connections are made per worker process. Every
    event is journaled on local disk first (``journal_dir``, else
    ``app.conf.pikku_journal_dir``, else ``PIKKU_JOURNAL_DIR``, else
    ``~/.local/state/pikku-celery/journal``) and written to SQL in group
    commits every ``app.conf.pikku_flush_interval`` (else ``PIKKU_FLUSH_INTERVAL``) seconds.
    The largest value it stores is ``app.conf.pikku_max_payload_bytes`` (else
    ``PIKKU_MAX_PAYLOAD_BYTES``, else 16 MiB); a ``store`` passed in keeps its own.

    ``mirror="all"`` (else ``app.conf.pikku_mirror``, else ``PIKKU_MIRROR``) mirrors
    every task of the app, not only ``WorkflowTask`` ones (``"steps"``, the default),
    but those ``exclude`` names (names or globs; else ``app.conf.pikku_mirror_exclude``).

    ``publisher_journal="node"`` (else ``app.conf.pikku_publisher_journal``, else
    ``PIKKU_PUBLISHER_JOURNAL``, else ``"own"``): a publishing process (a web app) only
    appends to its journal, and a prefork worker's main process on the same machine, or
    ``pikku-celery flusher``, writes it; a worker always writes its own.

    ``result_backend=True`` makes the same database Celery's result backend
    (``app.conf.result_backend = "pikku://"``): ``AsyncResult.get()`` reads what the
    mirror wrote, in the same transactions as the attempts. Waiting readers are told of
    results by the database (``LISTEN``/``NOTIFY``), or with
    ``app.conf.pikku_result_wakeups = "broker"`` (else ``PIKKU_RESULT_WAKEUPS``) on the
    app's Redis broker, for readers that cannot LISTEN.

    ``app.conf.pikku_read_database_url`` (else ``PIKKU_READ_DATABASE_URL``) names a
    streaming replica of the database for the faces' reads: :attr:`read_store`. The
    mirror, the result backend and its listener, and the workflow engine never use it.
    """

    def __init__(
        self,
        app: Celery,
        database_url: str | None = None,
        *,
        store: WorkflowStore | None = None,
        journal_dir: str | None = None,
        mirror: str | None = None,
        exclude: Iterable[str] | None = None,
        result_backend: bool = False,
        publisher_journal: str | None = None,
    ) -> None:
        if store is not None and database_url is not None:
            raise ConfigurationError("Pass either database_url or store, not both.")
        self.app = app
        self._selection = TaskSelection.configured(app.conf, mirror, exclude)
        if store is None:
            url = (
                database_url
                or app.conf.get("pikku_database_url")
                or os.environ.get(ENV_DATABASE_URL)
                or DEFAULT_DATABASE_URL
            )
            store = WorkflowStore(url, **_max_payload_bytes(app.conf))
        configure_wakeups(app.conf, store)
        self.mirror = Recorder(
            store,
            journal_dir=journal_dir or app.conf.get("pikku_journal_dir") or None,
            flush_interval=float(
                app.conf.get("pikku_flush_interval")
                or os.environ.get(ENV_FLUSH_INTERVAL)
                or FLUSH_INTERVAL
            ),
            publisher=_publisher_journal(app.conf, publisher_journal),
        )
        # Fail fast: a mirror that cannot journal would lose every event, one ERROR at a time.
        self.mirror.check_journal()
        self.workflows = WorkflowEngine(app, self.mirror)
        self._upkeep: Upkeep | None = None
        self._upkeep_pid = 0
        self.read_database_url: str | None = (
            app.conf.get("pikku_read_database_url") or os.environ.get(ENV_READ_DATABASE_URL) or None
        )
        self._read_store: WorkflowStore | None = None
        # Task events stay the user's choice: Flower needs them, the mirror does not.
        reap_task = as_task_function(self._reap_task)
        app.task(name=REAP_TASK, ignore_result=True, shared=False)(reap_task)
        signals.install(self)
        if result_backend:
            # Celery's own URL parsing finds the backend by its entry point: the same as
            # the user writing backend="pikku://".
            app.conf.update(result_backend=f"{SCHEME}://")

    def _results_here(self) -> bool:
        """The app's result backend is this store: its results expire here.

        Asked of the backend Celery made, not of the URL's spelling: a backend named by
        another alias (a loader's ``override_backends``, an entry point) or by its class
        is this store all the same.
        """
        return isinstance(self.app.backend, PikkuBackend)

    def _results_upkeep(self) -> int:
        """The reaper's pass over results: one step of expiry, and chords left unsent."""
        gone = expire_results(self.app, self.store)
        backend = self.app.backend
        if isinstance(backend, PikkuBackend):
            resend_after = float(self.app.conf.get("pikku_chord_resend_after") or RESEND_AFTER)
            resume_chords(backend, resend_after=resend_after)
        return gone

    def uninstall(self) -> None:
        """Stop mirroring this app's tasks in this process (``PikkuCelery(app)`` installed it).

        Only this one is taken off: a ``PikkuCelery`` made on the same app after it stays.
        The mirror itself stays open: what it journaled is written by its flusher (or
        adopted from its journal later); ``self.mirror.close()`` writes it now.
        """
        signals.uninstall(self)

    @property
    def store(self) -> WorkflowStore:
        return self.mirror.store

    @property
    def read_store(self) -> WorkflowStore:
        """The store the faces read through: ``create_app(pikku.read_store, actions=pikku)``.

        With a read replica (``read_database_url``), a face on the same engine as
        :attr:`store` whose reads go to the replica and whose writes (a dashboard's
        delete) go to the primary; without one, :attr:`store` itself.
        """
        if self.read_database_url is None:
            return self.store
        if self._read_store is None:
            self._read_store = WorkflowStore(self.store.engine, read_url=self.read_database_url)
        return self._read_store

    @property
    def selection(self) -> TaskSelection:
        """Which tasks are mirrored (``mode``: ``"steps"`` or ``"all"``), and as which step."""
        return self._selection

    @overload
    def step(self, fn: F, /) -> Any: ...

    @overload
    def step(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        step_name: str | None = None,
        retries: int | None = None,
        retry_delay: float | str | None = None,
        backoff: bool | int = False,
        **options: Any,
    ) -> Callable[[F], Any]: ...

    def step(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        step_name: str | None = None,
        retries: int | None = None,
        retry_delay: float | str | None = None,
        backoff: bool | int = False,
        **options: Any,
    ) -> Any:
        """A Celery task whose every attempt is a mirrored attempt of a step.

        ``retries`` retries any exception that many times through Celery's own
        ``autoretry_for``/``max_retries`` (a retry is a real Celery retry,
        visible as such in Flower); ``retry_delay`` is the delay in seconds (or a duration string,
        ``"5s"``, ``"200ms"``) and
        ``backoff`` turns on Celery's exponential backoff. Other keyword
        arguments are Celery task options.
        """
        task_options: dict[str, Any] = {"base": WorkflowTask, **options}
        if name is not None:
            task_options["name"] = name
        if step_name is not None:
            task_options["pikku_step_name"] = step_name
        if retries is not None:
            if retries < 0:
                raise ConfigurationError("retries must be 0 or more.")
            task_options.setdefault("autoretry_for", (Exception,))
            task_options["max_retries"] = retries
        if retry_delay is not None:
            # Checked now, so a delay the mirror could not store fails at import time.
            format_duration(retry_delay)
            task_options["default_retry_delay"] = (
                parse_duration(retry_delay).total_seconds()
                if isinstance(retry_delay, str)
                else retry_delay
            )
        if backoff:
            task_options["retry_backoff"] = backoff
        decorator = self.app.task(**task_options)
        return decorator(fn) if fn is not None else decorator

    def run(self, signature: Signature[Any], *, name: str, input: Any = None) -> str:
        """Publish a task or canvas (chain, group, chord, nested) as one run; returns its id."""
        run_id = self.store.create_run(name, input, wire={"type": "canvas"})
        token = signals.current_run.set(signals.RunContext(run_id))
        try:
            signature.apply_async()
        except Exception as exc:
            self.store.attempts.settle_run(run_id, "failed", exc)
            raise
        finally:
            signals.current_run.reset(token)
        return run_id

    # --- durable workflows ---------------------------------------------------------

    def workflow(
        self,
        name: str,
        *,
        version: str | None = None,
        compatible: Iterable[str] = (),
    ) -> Callable[[Callable[..., Any]], Workflow]:
        """Declare a durable workflow: ``fn(ctx, *args, **kwargs)`` replayed step by step.

        ``version`` defaults to a hash of the function's source; a run is only
        replayed by the version that started it or one listing it in ``compatible``.
        """

        def register(fn: Callable[..., Any]) -> Workflow:
            return self.workflows.define(name, fn, version, compatible)

        return register

    def wait(self, run_id: str, timeout: float = 60.0) -> Any:
        """The run's output once it completes; raises RunFailed, RunCancelled or WaitTimeout."""
        return self.workflows.wait(run_id, timeout)

    def resume(self, run_id: str) -> list[str]:
        """Retry a failed or stuck run's failed steps as new attempts; keep the rest."""
        return self.workflows.resume(run_id)

    def rerun(self, run_id: str, from_step: str) -> list[str]:
        """New attempts for ``from_step`` and every step after it."""
        return self.workflows.rerun(run_id, from_step)

    def cancel(self, run_id: str) -> list[str]:
        """Cancel the run and its unfinished child runs; its running steps are revoked."""
        return self.workflows.cancel(run_id)

    def send(self, run_id: str, name: str, data: Any = None) -> str:
        """Send an event to a run's ``ctx.wait_for(name)``; returns the event's id.

        The event is kept until a wait of that name takes it, so it may be sent
        before the workflow reaches its wait. Raises ``RunNotFound`` for an
        unknown run and ``RunSettled`` for one that has ended.
        """
        return self.workflows.send(run_id, name, data)

    # --- the stuck-attempt reaper ------------------------------------------------------

    def reaper(self, **options: Any) -> Reaper:
        """A :class:`Reaper` for this app; ``options`` are its keyword arguments."""
        return Reaper(
            self.app,
            self.store,
            replay=self.workflows.replay_soon,
            dispatched=self.mirror.dispatched,
            **options,
        )

    def reap(self, **options: Any) -> ReapReport:
        """One reaper pass now: lost attempts are marked, retried or failed."""
        return self.reaper(**options).reap()

    def reap_every(self, seconds: float = 60.0, **options: Any) -> None:
        """Run the reaper from celery beat every ``seconds`` (add ``-B`` or run ``beat``).

        Safe on several beats at once: every write of the reaper is guarded.
        """
        self.app.conf.beat_schedule = {
            **(self.app.conf.beat_schedule or {}),
            REAP_TASK: {
                "task": REAP_TASK,
                "schedule": seconds,
                "kwargs": options,
                # A pass that waited longer than its interval is replaced by the next one.
                "options": {"expires": seconds},
            },
        }

    def _reap_task(self, **options: Any) -> dict[str, Any]:
        return self.reap(**options).as_dict()

    # --- a worker's own upkeep ---------------------------------------------------------

    @property
    def reaper_interval(self) -> float:
        """Seconds between the workers' own reaper passes; 0 when they are turned off.

        ``app.conf.pikku_reaper_interval``, else ``PIKKU_REAPER_INTERVAL``, else 10.
        """
        configured = self.app.conf.get("pikku_reaper_interval")
        if configured is None:
            configured = os.environ.get(ENV_REAPER_INTERVAL)
        if configured is None or configured == "":
            return REAPER_INTERVAL
        if configured is False:
            return 0.0
        try:
            interval = float(configured)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"pikku_reaper_interval is seconds (10, 0.5) or 0 to turn the reaper off, "
                f"not {configured!r}."
            ) from None
        if interval < 0:
            raise ConfigurationError("pikku_reaper_interval is 0 (off) or more seconds.")
        return interval

    @property
    def retention(self) -> dt.timedelta | None:
        """How long runs are kept where the tables are laid out by day: the workers' upkeep
        drops the day partitions older than it (open runs' days are kept). None: never.

        ``app.conf.pikku_retention_days``, else ``PIKKU_RETENTION_DAYS``, else None.
        """
        configured = self.app.conf.get("pikku_retention_days")
        if configured is None:
            configured = os.environ.get(ENV_RETENTION_DAYS)
        if configured is None or configured == "" or configured is False:
            return None
        try:
            days = float(configured)
        except (TypeError, ValueError):
            days = 0.0
        if not days >= 1:
            raise ConfigurationError(
                f"pikku_retention_days is a number of days, 1 or more (30), not {configured!r}; "
                "leave it unset to keep every day partition."
            )
        return dt.timedelta(days=days)

    def _partitions_upkeep(self, retention: dt.timedelta | None) -> object:
        """The reaper's pass over the day partitions, where the tables are laid out by day."""
        partitions = self.store.partitions
        if not partitions.partitioned():  # read once: a plain layout costs nothing after
            return None
        return partitions.keep(retention).as_dict()

    def finished_result(self, step_id: str) -> tuple[bool, Any]:
        """(True, result) when the step already succeeded: a duplicate dispatch of it."""
        return self.workflows.finished_result(step_id)

    def prepare_upkeep(self, hostname: str) -> Upkeep:
        """When a worker's main process starts: its upkeep, which notes when that was.

        ``app.conf.pikku_reaper_options`` (a dict of :class:`Reaper` arguments)
        tunes the workers' passes; they look at attempts idle for 1 s.
        """
        self._upkeep_pid = os.getpid()
        if self._upkeep is None:
            options = {"idle_for": 1.0, **(self.app.conf.get("pikku_reaper_options") or {})}
            self._upkeep = Upkeep(
                self.mirror,
                lambda: self.reaper(**options),
                holder=hostname,
                interval=self.reaper_interval,
                recover=self.workflows.recover if self.workflows.workflows else None,
                recovery_lease=self.workflows.recovery_lease,
                expire=self._results_upkeep if self._results_here() else None,
                # Read here: a retention that is no number stops the worker at start.
                partitions=functools.partial(self._partitions_upkeep, self.retention),
            )
            self._upkeep.note_start()
        return self._upkeep

    @property
    def runs_upkeep(self) -> bool:
        """This is the process of a worker that runs its upkeep (its main process)."""
        return self._upkeep is not None and self._upkeep_pid == os.getpid()

    def start_upkeep(self, hostname: str) -> Upkeep:
        """Once the worker is ready: recovery, then the reaper at intervals, in a thread."""
        upkeep = self.prepare_upkeep(hostname)
        upkeep.start()
        return upkeep

    def stop_upkeep(self) -> None:
        if self._upkeep is not None:
            self._upkeep.stop()
            self._upkeep = None
