"""``pikku-celery demo``: the command (``command``) and the Celery app it runs (``app``,
which ``celery -A pikku_celery.demo.app worker`` starts in the Procfile and compose)."""

from __future__ import annotations

__all__: list[str] = []
