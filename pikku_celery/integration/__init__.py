"""The Celery adapters: they turn Celery's world into the mirror's events and store reads.

Signal handlers, the ``WorkflowTask`` base class, which tasks are mirrored,
the registry of installed apps, the reaper and the workers' upkeep. What they
see goes to the mirror's pipeline (``pikku_celery.mirror``), which journals it
and writes it to SQL; no SQL here.
"""

from __future__ import annotations

__all__: list[str] = []
