"""Progress of a long command on stderr: a bar redrawn in place on a terminal, lines elsewhere.

Output that is piped or logged (cron, CI, ``docker logs``) gets one plain line
per step instead of carriage returns that would pile up in the log.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``with Progress(total, "runs") as bar: bar.update(done)``."""

    def __init__(
        self, total: int, unit: str, *, stream: TextIO | None = None, width: int = 30
    ) -> None:
        self.total = max(total, 0)
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self._drawn = False

    def _text(self, done: int) -> str:
        # New runs can settle while a prune goes on: never show more than 100 %.
        total = max(self.total, done)
        share = done / total if total else 1.0
        if not self.tty:
            return f"{done}/{total} {self.unit} ({share:.0%})"
        filled = round(self.width * share)
        return (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {self.unit} {share:4.0%}"
        )

    def update(self, done: int) -> None:
        if self.tty:
            self.stream.write("\r" + self._text(done))
            self._drawn = True
        else:
            self.stream.write(self._text(done) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
