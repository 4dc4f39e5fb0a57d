"""The Celery side: thin adapters that turn Celery's events into store calls. No SQL here."""

from __future__ import annotations

__all__: list[str] = []
