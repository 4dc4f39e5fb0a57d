"""Which ``PikkuCelery`` is installed on which Celery app: one registry per process.

The signal handlers look an app up here for its mirror and task selection,
``WorkflowTask`` for the answer to a step that already succeeded, a worker's
``pikku_held`` command for the journal folders. ``PikkuCelery(app)`` adds
its entry (``signals.install``) and ``PikkuCelery.uninstall()`` removes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from pikku_celery.mirror import Recorder

if TYPE_CHECKING:
    # Only named in annotations: selection imports task, which looks apps up here.
    from pikku_celery.integration.selection import TaskSelection
    from pikku_celery.integration.upkeep import Upkeep

__all__ = ["Installed", "finished_result", "installed_on", "register", "registry", "unregister"]


class Installed(Protocol):
    """What the adapters need of the object installed on an app (``PikkuCelery``, which
    wires this layer and the workflows above it together, provides it)."""

    @property
    def app(self) -> Any: ...

    @property
    def mirror(self) -> Recorder: ...

    @property
    def selection(self) -> TaskSelection: ...

    def prepare_upkeep(self, hostname: str) -> Upkeep: ...

    @property
    def runs_upkeep(self) -> bool: ...

    def start_upkeep(self, hostname: str) -> Upkeep: ...

    def stop_upkeep(self) -> None: ...

    def finished_result(self, step_id: str) -> tuple[bool, Any]: ...


#: Every installed ``PikkuCelery`` of this process, by the id of its Celery app.
registry: dict[int, Installed] = {}


def register(pikku: Installed) -> None:
    """``pikku`` mirrors its app from now on (in place of one installed on it before)."""
    registry[id(pikku.app)] = pikku


def unregister(pikku: Installed) -> None:
    """``pikku`` mirrors its app no more; one installed on the app after it stays."""
    if registry.get(id(pikku.app)) is pikku:
        del registry[id(pikku.app)]


def installed_on(app: Any) -> Installed | None:
    """What is installed on ``app``; None when nothing is."""
    return registry.get(id(app))


def finished_result(app: Any, step_id: str) -> tuple[bool, Any]:
    """(True, result) when the workflow engine installed on ``app`` says the step already
    succeeded (a duplicate dispatch of it); (False, None) when it did not, or none is."""
    pikku = registry.get(id(app))
    return (False, None) if pikku is None else pikku.finished_result(step_id)
