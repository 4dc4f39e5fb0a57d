"""The ``pikku-celery`` command: its subcommands (``commands``), their options, the app
loader, and the reaper's and journal's own subcommands."""

from __future__ import annotations

from pikku_celery.cli.commands import main

__all__ = ["main"]
