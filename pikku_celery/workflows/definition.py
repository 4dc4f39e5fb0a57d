"""A workflow definition: its function, its name and the version that identifies its code."""

from __future__ import annotations

import hashlib
import inspect
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pikku_celery.errors import ConfigurationError

__all__ = ["Workflow", "code_version"]

# Run ids derived from idempotency keys: this project's own namespace, so they never
# collide with the step keys derived in Pikku's.
_START_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pikku.dev/celery/start")


def code_version(fn: Callable[..., Any]) -> str:
    """A short hash of the function's source: a code change is a new version."""
    try:
        source = inspect.getsource(fn).encode()
    except (OSError, TypeError):  # no source file (a REPL, a frozen app): use the bytecode
        source = fn.__code__.co_code
    return hashlib.sha256(source).hexdigest()[:12]


@dataclass(frozen=True)
class Workflow:
    """What ``@pikku.workflow(...)`` returns; call ``.start(...)`` to run it."""

    name: str
    fn: Callable[..., Any]
    version: str
    compatible: frozenset[str] = frozenset()
    starter: Callable[[Workflow, tuple[Any, ...], dict[str, Any], str | None], str] | None = field(
        default=None, repr=False, compare=False
    )

    def accepts(self, version: str | None) -> bool:
        """Whether a run started by ``version`` may be replayed by this code."""
        return version == self.version or version in self.compatible

    def start(
        self,
        *args: Any,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Start a run and return its id at once; a worker replays it step by step.

        ``run_id`` (or ``idempotency_key``, from which a run id is derived):
        a start with an id that a run of this workflow has already returns
        that run and starts nothing, even when several processes race. Both
        names are taken by ``start``, so they never reach the workflow.
        """
        if self.starter is None:
            raise RuntimeError("This workflow is not registered; use @pikku.workflow(...).")
        if run_id is not None and idempotency_key is not None:
            raise ConfigurationError("Pass run_id or idempotency_key to start(), not both.")
        if idempotency_key is not None:
            run_id = self.run_id_for(idempotency_key)
        if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
            raise ConfigurationError(f"A run id is a non-empty str, not {run_id!r}.")
        return self.starter(self, args, kwargs, run_id)

    def run_id_for(self, idempotency_key: str) -> str:
        """The run id a start with this ``idempotency_key`` gets (the same in every process)."""
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise ConfigurationError(
                f"An idempotency key is a non-empty str, not {idempotency_key!r}."
            )
        return str(uuid.uuid5(_START_NAMESPACE, f"{self.name}:{idempotency_key}"))

    @property
    def graph(self) -> dict[str, Any]:
        """What is stored in ``workflow_versions`` for this version."""
        try:
            source = inspect.getsource(self.fn)
        except (OSError, TypeError):
            source = None
        return {"module": self.fn.__module__, "qualname": self.fn.__qualname__, "source": source}
