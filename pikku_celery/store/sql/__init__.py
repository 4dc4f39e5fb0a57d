"""The statements the store sends, one module per operation module of the store
(``attempts`` for ``store/attempts.py``, ``reap`` for ``store/reap.py``, ...)."""

from __future__ import annotations

__all__: list[str] = []
