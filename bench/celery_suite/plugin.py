"""The pytest plugin loaded into Celery's integration suite (``-p bench.celery_suite.plugin``).

It changes nothing in the suite's files. What it does, read from the environment that
``run.py`` sets:

- ``PIKKU_SUITE_MODE`` ``all`` or ``steps``: once each of the suite's two apps exists (the
  fixtures ``celery_app``, one per test, which publishes, and ``celery_session_app``, the
  one the embedded worker runs), ``PikkuCelery(app, database_url=..., mirror="all")`` or
  ``PikkuCelery(app, database_url=...)`` is installed on it, as a user would right after
  making the app. ``plain``: pikku-celery is not imported at all. At the end of each
  test, the ``PikkuCelery`` of its own app is closed (``uninstall``, ``mirror.close()``,
  ``store.close()``): the session app's, the worker's, is left to pikku-celery.
- ``backend``: as ``all``, and the suite's ``TEST_BACKEND`` names pikku-celery's result
  backend. With ``PIKKU_SUITE_BACKEND_ALIAS`` set (say ``redispikku``), that URL is
  ``redispikku+postgresql://...``: the alias is registered on each app's loader
  (``override_backends``, which Celery's ``by_name`` reads beside its own aliases) as
  ``PikkuBackend``, before anything asks for the app's backend. Celery's own
  ``by_url`` splits the scheme at ``+``: the class is the alias's, the URL handed to it
  the database's. So the tests that skip themselves unless ``result_backend`` starts with
  ``redis`` run, on the store, their text unchanged. Which class each app's backend is,
  and the backend of every task body that ran, are recorded.
- In every mode, records what ``run.py`` reads afterwards, under ``PIKKU_SUITE_OUT``:
  every test phase's outcome (``reports.jsonl``), every execution of a task body as
  ``task_prerun`` reports it, in the process that runs it (``prerun/<pid>.jsonl``), pikku's
  warnings (``logs/<pid>.jsonl``) and the times of the session's end (``session.json``).
- Before the last test's teardown (so the worker is still up), waits
  ``PIKKU_SUITE_SETTLE`` seconds: the mirror's flushers and the worker's reaper get that
  long to converge before anything stops.
- After pytest's last hook, a process that has not exited within 3 s writes the stacks of
  all its threads to ``exit-stacks.txt``.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any, Final, TextIO

import pytest
from celery import Celery
from celery.signals import task_prerun

__all__ = [
    "ENV_BACKEND_ALIAS",
    "ENV_DATABASE_URL",
    "ENV_MODE",
    "ENV_OUT",
    "ENV_SETTLE",
    "MIRRORED_MODES",
    "PIKKU_BACKEND",
    "register_alias",
]

ENV_MODE: Final = "PIKKU_SUITE_MODE"
ENV_OUT: Final = "PIKKU_SUITE_OUT"
ENV_DATABASE_URL: Final = "PIKKU_SUITE_DATABASE_URL"
ENV_SETTLE: Final = "PIKKU_SUITE_SETTLE"
ENV_BACKEND_ALIAS: Final = "PIKKU_SUITE_BACKEND_ALIAS"
#: The modes that install PikkuCelery on the suite's apps.
MIRRORED_MODES: Final = frozenset({"all", "steps", "backend"})
#: pikku-celery's result backend, as Celery's aliases name a class.
PIKKU_BACKEND: Final = "pikku_celery.integration.backend:PikkuBackend"

#: The fixtures of celery.contrib.pytest that make the suite's apps.
APP_FIXTURES: Final = frozenset({"celery_app", "celery_session_app"})
WORKER_FIXTURE: Final = "celery_session_worker"
#: Seconds after pytest's last hook at which a process that has not exited dumps its stacks.
EXIT_STACKS_AFTER: Final = 3.0
_exit_stacks: list[TextIO] = []


def _out() -> Path:
    return Path(os.environ[ENV_OUT])


def _mode() -> str:
    return os.environ.get(ENV_MODE, "plain")


class _Recorder:
    """Lines of JSON appended to one file per process (a pool child forks with the plugin)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        path = _out() / self.folder / f"{os.getpid()}.jsonl"
        line = json.dumps(record, default=repr) + "\n"
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as file:
                file.write(line)


_prerun = _Recorder("prerun")
_logs = _Recorder("logs")
_reports = _Recorder("reports")
_session: dict[str, Any] = {
    "mode": _mode(),
    "installed": {"celery_app": 0, "celery_session_app": 0},
    # fixture -> {backend class: how many apps of that fixture had it}
    "backends": {"celery_app": {}, "celery_session_app": {}},
}


def _class_name(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _on_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    request = getattr(task, "request", None)
    delivery = getattr(request, "delivery_info", None) or {}
    _prerun.write(
        {
            "id": task_id,
            "name": getattr(task, "name", None),
            "retries": getattr(request, "retries", None),
            "redelivered": delivery.get("redelivered") if isinstance(delivery, dict) else None,
            "pid": os.getpid(),
            "t": time.time(),
            # The backend the worker stores this task's result with.
            "backend": _class_name(getattr(task, "backend", None)),
        }
    )


class _PikkuLogHandler(logging.Handler):
    """pikku-celery's warnings and errors (a handler that failed, an event set aside)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _logs.write(
                {
                    "t": record.created,
                    "pid": os.getpid(),
                    "logger": record.name,
                    "level": record.levelname,
                    "message": record.getMessage(),
                    "action": getattr(record, "action", None),
                    "exc": None if record.exc_info is None else repr(record.exc_info[1]),
                }
            )
        except Exception:
            self.handleError(record)


def pytest_configure(config: pytest.Config) -> None:
    _session["configured_at"] = time.time()
    task_prerun.connect(_on_prerun, weak=False, dispatch_uid="pikku_suite_prerun")
    pikku_logger = logging.getLogger("pikku_celery")
    # The embedded worker sets the root logger to ERROR; the mirror's warnings count too.
    pikku_logger.setLevel(logging.WARNING)
    pikku_logger.addHandler(_PikkuLogHandler(logging.WARNING))


def register_alias(app: Celery, alias: str) -> None:
    """``alias+<database URL>`` makes ``app``'s result backend pikku-celery's.

    Celery's loader aliases (``override_backends``) are looked up before its own and its
    entry points'; set on this app's loader only, nothing else in the process changes.
    """
    app.loader.override_backends = {**app.loader.override_backends, alias: PIKKU_BACKEND}


def _install(app: Celery, fixture: str) -> Any:
    from pikku_celery import PikkuCelery

    url = os.environ[ENV_DATABASE_URL]
    mode = _mode()
    alias = os.environ.get(ENV_BACKEND_ALIAS)
    if mode == "backend" and alias:
        register_alias(app, alias)
    if mode in ("all", "backend"):
        pikku = PikkuCelery(app, database_url=url, mirror="all")
    else:
        pikku = PikkuCelery(app, database_url=url)
    _session["installed"][fixture] += 1
    if mode == "backend":
        found = _session["backends"][fixture]
        name = _class_name(app.backend)
        found[name] = found.get(name, 0) + 1
        _session["result_backend"] = str(app.conf.result_backend)
    return pikku


def _close(pikku: Any) -> None:
    """The end of a test's own app: its PikkuCelery written out and its connections let go,
    as a user closing an app would. Left open, every test's store kept its connections (a
    flusher's, the result backend's readers') and 100 of PostgreSQL's ran out mid-suite."""
    started = time.time()
    pikku.uninstall()
    pikku.mirror.close()
    pikku.store.close()
    _session["closing_s"] = round(_session.get("closing_s", 0.0) + time.time() - started, 3)


def _save() -> None:
    """``session.json`` as it stands: written at each step, so a killed session leaves one."""
    path = _out() / "session.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(_session, indent=2), encoding="utf-8")
    partial.replace(path)


def _stamp(name: str) -> None:
    _session.setdefault(name, time.time())
    _save()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: Any) -> Generator[None]:
    value: Any = yield
    name = fixturedef.argname
    if name in APP_FIXTURES and _mode() in MIRRORED_MODES and isinstance(value, Celery):
        pikku = _install(value, name)
        if name == "celery_app":
            # Finalizers run last-in first-out: before the fixture's own teardown.
            fixturedef.addfinalizer(lambda: _close(pikku))
    if name == WORKER_FIXTURE:
        _session["worker_started_at"] = time.time()
        _save()
        # Finalizers run last-in first-out: this one runs before the fixture's own
        # teardown (stopping the worker), pytest_fixture_post_finalizer after it.
        fixturedef.addfinalizer(lambda: _stamp("worker_teardown_started_at"))
    return value  # type: ignore[no-any-return]


def pytest_fixture_post_finalizer(fixturedef: pytest.FixtureDef[Any], request: Any) -> None:
    if fixturedef.argname == WORKER_FIXTURE and "worker_teardown_started_at" in _session:
        _stamp("worker_teardown_ended_at")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    if nextitem is None:
        settle = float(os.environ.get(ENV_SETTLE) or 0)
        _session["settle_started_at"] = time.time()
        time.sleep(settle)
        _session["settle_ended_at"] = time.time()
        _save()
    result: None = yield
    return result


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        message = str(getattr(crash, "message", ""))
    elif isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        message = str(longrepr[2])
    else:
        message = "" if longrepr is None else str(longrepr)
    _reports.write(
        {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "wasxfail": hasattr(report, "wasxfail"),
            "subtest": hasattr(report, "context"),
            "start": report.start,
            "stop": report.stop,
            "duration": report.duration,
            "message": message[:2000],
        }
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    _session["collected"] = [item.nodeid for item in session.items]
    _session["collected_at"] = time.time()
    _save()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _session["sessionfinish_at"] = time.time()
    _session["exitstatus"] = int(exitstatus)
    _save()


def pytest_unconfigure(config: pytest.Config) -> None:
    _session["unconfigure_at"] = time.time()
    _session["pikku_celery_imported"] = "pikku_celery" in sys.modules
    if "pikku_celery" in sys.modules:  # which copy: the snapshot run.py made, or the work tree
        _session["pikku_celery_file"] = getattr(sys.modules["pikku_celery"], "__file__", None)
    # A process still alive EXIT_STACKS_AFTER s from now (in its atexit handlers, or held by a
    # thread) writes every thread's stack to exit-stacks.txt: where the exit waits.
    _exit_stacks.append((_out() / "exit-stacks.txt").open("w", encoding="utf-8"))
    faulthandler.dump_traceback_later(EXIT_STACKS_AFTER, file=_exit_stacks[0])
    _session["threads_alive"] = sorted(
        f"{thread.name}{' (daemon)' if thread.daemon else ''}"
        for thread in threading.enumerate()
        if thread is not threading.main_thread()
    )
    _save()
