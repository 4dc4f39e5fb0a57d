"""Which tasks of an app the mirror records, and under which step name.

Every signal handler asks one :class:`TaskSelection` about the task it sees.
Under ``"steps"`` (the default) only ``WorkflowTask`` tasks are mirrored;
under ``"all"`` every task is, except Celery's and pikku-celery's own
plumbing and the names the exclude list matches. The answer for a task name is
worked out once and cached: handlers run on every task, so no glob is matched
per event after a name's first.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from typing import Any, Final

from pikku_celery.errors import ConfigurationError
from pikku_celery.integration.task import WorkflowTask, default_step_name

__all__ = [
    "ENV_MIRROR",
    "ENV_MIRROR_EXCLUDE",
    "MIRROR_ALL",
    "MIRROR_MODES",
    "MIRROR_STEPS",
    "NEVER_MIRRORED",
    "TaskSelection",
]

#: Only ``WorkflowTask`` tasks (``@pikku.step``, ``base=WorkflowTask``): the default.
MIRROR_STEPS: Final = "steps"
#: Every task of the app, whatever its class, but the excluded ones.
MIRROR_ALL: Final = "all"
MIRROR_MODES: Final = (MIRROR_STEPS, MIRROR_ALL)

ENV_MIRROR: Final = "PIKKU_MIRROR"
ENV_MIRROR_EXCLUDE: Final = "PIKKU_MIRROR_EXCLUDE"

#: Never steps under ``"all"``: Celery's built-ins (chord_unlock, backend_cleanup,
#: accumulate, ...) and pikku-celery's own tasks (orchestrate, wake, reap) are
#: plumbing, and a chord's unlock task retries itself every second while it waits.
NEVER_MIRRORED: Final = ("celery.*", "pikku_celery.*")


class TaskSelection:
    """Decides, once per task name, whether the mirror records a task and as which step.

    ``mode`` is ``"steps"`` or ``"all"``; ``exclude`` holds task names or
    ``fnmatch`` globs (``"myapp.noisy_*"``), and applies under ``"all"`` only:
    a ``WorkflowTask`` is a step whatever the mode, since a durable workflow's
    run cannot go on without its steps' outcomes.
    """

    def __init__(self, mode: str = MIRROR_STEPS, exclude: Iterable[str] = ()) -> None:
        self.mode = _mode(mode, "mirror=")
        self.exclude = _patterns(exclude, "exclude=")
        self._step_names: dict[str, str | None] = {}

    @classmethod
    def configured(
        cls, conf: Any, mode: str | None = None, exclude: Iterable[str] | None = None
    ) -> TaskSelection:
        """From the arguments, else ``conf.pikku_mirror``/``conf.pikku_mirror_exclude``,
        else ``PIKKU_MIRROR``/``PIKKU_MIRROR_EXCLUDE`` (a comma-separated list)."""
        where = "mirror="
        if mode is None:
            mode, where = _setting(conf, "pikku_mirror", ENV_MIRROR)
        resolved = _mode(mode if mode is not None else MIRROR_STEPS, where)
        if exclude is not None:
            if resolved != MIRROR_ALL:
                raise ConfigurationError(
                    f"exclude= only applies to mirror={MIRROR_ALL!r} (under {resolved!r} only "
                    "WorkflowTask tasks are mirrored); pass mirror='all' as well, or drop exclude."
                )
            return cls(resolved, _patterns(exclude, "exclude="))
        configured, where = _setting(conf, "pikku_mirror_exclude", ENV_MIRROR_EXCLUDE)
        return cls(resolved, _patterns(configured if configured is not None else (), where))

    @property
    def mirrors_all(self) -> bool:
        return self.mode == MIRROR_ALL

    def step_name(self, task: Any) -> str | None:
        """The task's step name in runs, or None when the mirror leaves it alone."""
        name = str(getattr(task, "name", None) or "")
        try:
            return self._step_names[name]
        except KeyError:
            pass
        decided = self._decide(task, name)
        # Each process decides a name at most a few times (racing threads agree).
        self._step_names[name] = decided
        return decided

    def mirrors(self, task: Any) -> bool:
        return self.step_name(task) is not None

    def _decide(self, task: Any, name: str) -> str | None:
        if isinstance(task, WorkflowTask):
            return task.step_name_for(name)
        if self.mode != MIRROR_ALL or not name or self._excluded(name):
            return None
        return default_step_name(name)

    def _excluded(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, glob) for glob in (*NEVER_MIRRORED, *self.exclude))


def _setting(conf: Any, key: str, env: str) -> tuple[Any, str]:
    """A setting's value and where it came from (for the error that names it)."""
    value = conf.get(key) if conf is not None else None
    if value is not None:
        return value, f"app.conf.{key}"
    from_env = os.environ.get(env)
    if from_env is not None and from_env.strip():
        return from_env, env
    return None, key


def _mode(value: Any, where: str) -> str:
    mode = value.strip().lower() if isinstance(value, str) else value
    if mode not in MIRROR_MODES:
        raise ConfigurationError(
            f"{where} is {MIRROR_STEPS!r} (only WorkflowTask tasks, the default) or "
            f"{MIRROR_ALL!r} (every task of the app but the excluded ones), not {value!r}."
        )
    return str(mode)


def _patterns(value: Any, where: str) -> tuple[str, ...]:
    # A string is a comma-separated list (how an environment variable holds one), so
    # exclude="myapp.noisy_*" is one glob and never a list of its characters.
    items = value.split(",") if isinstance(value, str) else value
    items = list(items) if isinstance(items, Iterable) else [value]
    if not all(isinstance(p, str) for p in items):
        raise ConfigurationError(
            f"{where} is a list of task names or globs, such as ['celery.*', 'myapp.noisy_*'], "
            f"not {value!r}."
        )
    return tuple(p.strip() for p in items if p.strip())
