"""``InlineRunner``: a PikkuCelery app's workflows and steps, run in the calling thread.

The runner is a broker and a worker in one: whatever the app publishes goes to
an in-memory broker, and :meth:`InlineRunner.run_until_idle` takes the messages
one by one, runs each as a worker would, writes the mirror's journal to the
runner's store, and goes on until no message is due and nothing waits to be
written. It knows nothing of how workflows work beyond that loop, so whatever
the engine sends (a replay, a wake-up, a child run's start) runs here too.

Time is the runner's clock (:class:`~pikku_celery.testing.clock.InlineClock`):
it stands still until :meth:`InlineRunner.advance` moves it, and a message with
an ETA (a retry's countdown, a sleep's wake-up, a wait's timeout) runs once the
clock reaches it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from celery.canvas import Signature

from pikku_celery.app import PikkuCelery
from pikku_celery.errors import ConfigurationError, NeverIdle, StoreUnavailable
from pikku_celery.store import WorkflowStore
from pikku_celery.testing.broker import InMemoryBroker
from pikku_celery.testing.clock import InlineClock
from pikku_celery.testing.results import RunResult, read_result
from pikku_celery.testing.worker import InlineWorker
from pikku_celery.workflows.definition import Workflow

__all__ = ["InlineRunner", "inline"]

MAX_MESSAGES: Final = 10_000
# How long journaled events may wait for what they need (an event deferred by the
# mirror) once no message is left, before run_until_idle gives up.
SETTLE_TIMEOUT: Final = 5.0


class InlineRunner:
    """Runs ``pikku``'s app with no broker and no worker, against a store of its own.

    ``database_url``: the store (default: a new SQLite file in a temporary
    folder, migrated); ``journal_dir``: where the mirror journals (default: in
    that folder). While the runner is open, the app publishes to an in-memory
    broker, keeps results in memory and ``pikku`` mirrors into the runner's
    store; :meth:`close` (or leaving the ``with`` block) puts all of it back.

    Messages with an ETA or a countdown (retry delays, durable sleeps, the
    timeouts of waits) wait for the runner's clock, which starts at the time the
    runner opens and moves only with :meth:`advance`: without it, a sleeping or
    waiting run stays ``suspended``. ``fast_forward=True`` (also an attribute you
    may set on an open runner) moves the clock to the next ETA whenever nothing
    else is due, so every delay, sleep and timeout passes at once, in order.
    """

    def __init__(
        self,
        pikku: PikkuCelery,
        *,
        database_url: str | None = None,
        journal_dir: str | Path | None = None,
        hostname: str | None = None,
        fast_forward: bool = False,
    ) -> None:
        self.pikku = pikku
        self.app = pikku.app
        self.fast_forward = fast_forward
        self._database_url = database_url
        self._journal_dir = journal_dir
        self._hostname = hostname
        self._stack: contextlib.ExitStack | None = None
        self._store: WorkflowStore | None = None
        self._broker: InMemoryBroker | None = None
        self._worker: InlineWorker | None = None
        self._clock: InlineClock | None = None

    # --- lifetime -----------------------------------------------------------------------

    def open(self) -> InlineRunner:
        """Point the app and ``pikku`` at the runner (``with`` does this for you)."""
        if self._stack is not None:
            return self
        with contextlib.ExitStack() as stack:
            folder: Path | None = None
            if self._database_url is None or self._journal_dir is None:
                folder = Path(tempfile.mkdtemp(prefix="pikku-inline-"))
                stack.callback(shutil.rmtree, folder, ignore_errors=True)
            url = self._database_url or f"sqlite:///{folder}/pikku.db"
            store = WorkflowStore(url)
            stack.callback(store.close)
            store.init()
            broker = InMemoryBroker(self.app)
            broker.attach()
            stack.callback(broker.detach)
            clock = InlineClock()
            stack.enter_context(clock.installed(self.app))
            # Restored before the broker: the last flush may send replays, and they
            # must reach the in-memory broker, never the configured one.
            journal_dir = self._journal_dir or (Path(str(folder)) / "journal")
            stack.enter_context(
                self.pikku.mirror.redirected(store, journal_dir=journal_dir, background=False)
            )
            worker = InlineWorker(self.app, broker, self._hostname)
            worker.start()
            stack.callback(worker.stop)
            self._store, self._broker, self._worker = store, broker, worker
            self._clock = clock
            self._stack = stack.pop_all()
        return self

    def close(self) -> None:
        """Put the app's broker, result backend and ``pikku``'s store back as they were."""
        stack, self._stack = self._stack, None
        self._store = self._broker = self._worker = None
        self._clock = None
        if stack is not None:
            stack.close()

    def __enter__(self) -> InlineRunner:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def store(self) -> WorkflowStore:
        """The runner's store: read runs, steps and attempts from it."""
        return self._open()[0]

    @property
    def now(self) -> dt.datetime:
        """The runner's clock: the time the workflows and the app see (aware, UTC)."""
        return self._open()[3].now()

    def _open(self) -> tuple[WorkflowStore, InMemoryBroker, InlineWorker, InlineClock]:
        if (
            self._store is None
            or self._broker is None
            or self._worker is None
            or self._clock is None
        ):
            raise ConfigurationError(
                "The inline runner is not open; use it as `with InlineRunner(pikku) as "
                "runner:` or call runner.open() first."
            )
        return self._store, self._broker, self._worker, self._clock

    # --- running ------------------------------------------------------------------------

    def run_until_idle(self, max_messages: int = MAX_MESSAGES) -> int:
        """Run messages until none is due and the mirror has written everything.

        Returns how many messages ran. Messages whose ETA the clock has not
        reached stay held (unless ``fast_forward``). Raises :class:`NeverIdle`
        when ``max_messages`` ran and more are due (a step retrying for ever, a
        workflow that never ends).
        """
        return self._run(max_messages, until=None)

    def advance(self, seconds: float | dt.timedelta, max_messages: int = MAX_MESSAGES) -> int:
        """Move the runner's clock forward by ``seconds`` and run what becomes due.

        The clock stops at each held ETA on the way, earliest first, and runs
        what is due there until idle before it goes on, so a message published
        on the way (a retry after a retry, a sleep after a timeout) is due at
        its own time. Returns how many messages ran; read runs with
        :meth:`result`.
        """
        delta = seconds if isinstance(seconds, dt.timedelta) else dt.timedelta(seconds=seconds)
        if delta < dt.timedelta(0):
            raise ConfigurationError(
                f"The inline runner's clock only moves forward; advance({seconds!r}) "
                "needs 0 seconds or more."
            )
        return self._run(max_messages, until=self._open()[3].now() + delta)

    def _run(self, max_messages: int, until: dt.datetime | None) -> int:
        _, broker, worker, clock = self._open()
        skip = worker.control_queues
        ran = 0
        deadline: float | None = None
        while True:
            self._flush()
            worker.read_control()
            now = clock.now()
            if ran >= max_messages:
                waiting = broker.waiting(now, skip)
                if waiting:
                    raise NeverIdle(ran, waiting)
            message = broker.next_message(now, skip)
            if message is not None:
                worker.execute(message)
                ran += 1
                deadline = None
                continue
            if self.pikku.mirror.journal_depth != 0:
                # Events the mirror deferred (they wait for another event): give them a moment.
                deadline = deadline or time.monotonic() + SETTLE_TIMEOUT
                if time.monotonic() > deadline:
                    raise NeverIdle(ran, {})
                time.sleep(0.01)
                continue
            # Nothing is due and everything is written, as it would be by then on a
            # worker: only now may time pass, and only to the next ETA.
            eta = broker.next_eta()
            if eta is not None and (self.fast_forward or (until is not None and eta <= until)):
                clock.move_to(eta)
                continue
            if until is not None:
                clock.move_to(until)
            return ran

    def _flush(self) -> None:
        if not self.pikku.mirror.flush():
            raise StoreUnavailable(
                "The inline runner's database cannot be reached; check its database_url "
                "(leave it out for a temporary SQLite file)."
            )

    def result(self, run_id: str) -> RunResult:
        """The run as the store holds it now, with its steps and their attempts."""
        return read_result(self.store, run_id)

    def start(self, workflow: Workflow, *args: Any, **kwargs: Any) -> RunResult:
        """Start a run of ``workflow`` and run until idle; returns the run."""
        self._open()
        if self.pikku.workflows.workflows.get(workflow.name) is not workflow:
            raise ConfigurationError(
                f"Workflow {workflow.name!r} is not declared on this runner's PikkuCelery; "
                "give InlineRunner the PikkuCelery whose @pikku.workflow declared it."
            )
        run_id = workflow.start(*args, **kwargs)
        self.run_until_idle()
        return self.result(run_id)

    def delay(self, task: Any, *args: Any, **kwargs: Any) -> RunResult:
        """Publish a pikku step on its own (its own run, whose id is the task id) and run it."""
        self._open()
        if getattr(task, "app", None) is not self.app or not self.pikku.selection.mirrors(task):
            raise ConfigurationError(
                f"{getattr(task, 'name', task)!r} is not a mirrored task of this runner's app, "
                "so it would have no run to return; declare it with @pikku.step (or "
                "base=WorkflowTask, or PikkuCelery(app, mirror='all')) on the app given to "
                "PikkuCelery."
            )
        sent = task.apply_async(args, kwargs)
        self.run_until_idle()
        return self.result(str(sent.id))

    def run(self, signature: Signature[Any], *, name: str, input: Any = None) -> RunResult:
        """Publish a task or canvas as one run (``pikku.run``) and run until idle."""
        self._open()
        run_id = self.pikku.run(signature, name=name, input=input)
        self.run_until_idle()
        return self.result(run_id)

    def resume(self, run_id: str) -> RunResult:
        """``pikku.resume``: new attempts for the failed steps, the rest kept; then run."""
        return self._control(run_id, lambda: self.pikku.resume(run_id))

    def rerun(self, run_id: str, from_step: str) -> RunResult:
        """``pikku.rerun``: new attempts from ``from_step`` on; then run until idle."""
        return self._control(run_id, lambda: self.pikku.rerun(run_id, from_step))

    def cancel(self, run_id: str) -> RunResult:
        """``pikku.cancel``: the run cancelled and its open steps revoked; then run."""
        return self._control(run_id, lambda: self.pikku.cancel(run_id))

    def send(self, run_id: str, name: str, data: Any = None) -> RunResult:
        """``pikku.send``: an event for a run waiting for it; then run until idle."""
        return self._control(run_id, lambda: self.pikku.send(run_id, name, data))

    def _control(self, run_id: str, call: Callable[[], object]) -> RunResult:
        self._open()
        self._flush()  # what was published so far is in SQL, as it would be 40 ms later
        call()
        self.run_until_idle()
        return self.result(run_id)


@contextlib.contextmanager
def inline(
    pikku: PikkuCelery,
    *,
    database_url: str | None = None,
    journal_dir: str | Path | None = None,
    fast_forward: bool = False,
) -> Iterator[InlineRunner]:
    """``with inline(pikku) as runner:`` an open :class:`InlineRunner`, closed at the end."""
    with InlineRunner(
        pikku, database_url=database_url, journal_dir=journal_dir, fast_forward=fast_forward
    ) as runner:
        yield runner
