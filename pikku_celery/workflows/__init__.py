"""Durable workflows: plain functions replayed from the top, each step an ordinary Celery task."""

from __future__ import annotations

__all__: list[str] = []
