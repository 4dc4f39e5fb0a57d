"""A workflow definition: its function, its name and the version that identifies its code."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Workflow", "code_version"]


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
    starter: Callable[[Workflow, tuple[Any, ...], dict[str, Any]], str] | None = field(
        default=None, repr=False, compare=False
    )

    def accepts(self, version: str | None) -> bool:
        """Whether a run started by ``version`` may be replayed by this code."""
        return version == self.version or version in self.compatible

    def start(self, *args: Any, **kwargs: Any) -> str:
        """Start a run and return its id at once; a worker replays it step by step."""
        if self.starter is None:
            raise RuntimeError("This workflow is not registered; use @pikku.workflow(...).")
        return self.starter(self, args, kwargs)

    @property
    def graph(self) -> dict[str, Any]:
        """What is stored in ``workflow_versions`` for this version."""
        try:
            source = inspect.getsource(self.fn)
        except (OSError, TypeError):
            source = None
        return {"module": self.fn.__module__, "qualname": self.fn.__qualname__, "source": source}
