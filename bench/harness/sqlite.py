"""The benches' own SQLite database files: made fresh, deleted afterwards."""

from __future__ import annotations

import tempfile
from pathlib import Path

__all__ = ["SqliteFiles"]


class SqliteFiles:
    """Database files beside ``path`` (default: in a temporary directory), one per name.

    ``path`` must not exist: the bench deletes what it made, and nothing else.
    """

    def __init__(self, path: Path | None, names: tuple[str, ...] = ("main",)) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pikku-bench-")
            path = Path(self._tmp.name) / "bench.db"
        self.path = path
        for name in names:
            if self._path(name).exists():
                raise SystemExit(
                    f"{self._path(name)} already exists; give --sqlite-path a new file, "
                    "which the bench creates and deletes."
                )
        self._created: set[str] = set()

    def _path(self, name: str) -> Path:
        if name == "main":
            return self.path
        return self.path.with_name(f"{self.path.stem}-{name}{self.path.suffix}")

    def fresh(self, name: str) -> str:
        """Database file ``name`` removed if there; its URL."""
        self._remove(name)
        self._created.add(name)
        return f"sqlite:///{self._path(name)}"

    def drop(self) -> None:
        for name in sorted(self._created):
            self._remove(name)
        self._created.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _remove(self, name: str) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self._path(name)}{suffix}").unlink(missing_ok=True)
