"""What the dashboard can ask of a run beyond reading it; the application injects it."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["RunActions"]


class RunActions(Protocol):
    """Run actions the dashboard offers once a password is set (``PikkuCelery`` is one).

    The dashboard only calls these; what they do (publishing tasks, revoking
    them) is the application's business. Return values are ignored; raise a
    ``PikkuCeleryError`` to show its message to the user.
    """

    def resume(self, run_id: str) -> object: ...

    def rerun(self, run_id: str, from_step: str) -> object: ...

    def cancel(self, run_id: str) -> object: ...

    def send(self, run_id: str, name: str, data: Any = None) -> object: ...
