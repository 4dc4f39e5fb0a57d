"""What the command and the dashboard both show: runs as plain text (``text``) and as
JSON documents (``documents``), rendered one way for both."""

from __future__ import annotations

__all__: list[str] = []
