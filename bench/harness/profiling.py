"""Where a benchmark's time goes: a cProfile run summed per unit of work."""

from __future__ import annotations

import cProfile
import pstats
from pathlib import Path
from typing import Any

from bench.harness.report import say

__all__ = ["say_profile"]


def say_profile(profiler: cProfile.Profile, count: int, unit: str, what: str) -> None:
    stats = pstats.Stats(profiler)
    total = sum(entry[2] for entry in stats.stats.values())  # type: ignore[attr-defined]
    driver = _driver_time(stats)
    say(f"  {what} under cProfile (profiling inflates Python-heavy code):")
    say(f"    total                        {total / count * 1e6:8.1f} µs per {unit}")
    say(
        "    in the driver (execute/executemany/fetch/commit/rollback) "
        f"{driver / count * 1e6:8.1f} µs"
    )
    say(f"    elsewhere (SQLAlchemy, store) {(total - driver) / count * 1e6:8.1f} µs")
    say("  top functions by own time:")
    for (path, line, name), entry in _top(stats, 15):
        calls, own, cumulative = entry[1], entry[2], entry[3]
        where = name if path == "~" else f"{_short(path)}:{line}({name})"
        say(
            f"    {own / count * 1e6:7.2f} µs own {cumulative / count * 1e6:8.2f} µs cum "
            f"{calls / count:5.1f} calls  {where}"
        )


def _short(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("site-packages", "pikku_celery"):
        if anchor in parts:
            index = parts.index(anchor)
            return "/".join(parts[index + (anchor == "site-packages") :])
    return Path(path).name


def _top(stats: pstats.Stats, limit: int) -> list[tuple[tuple[str, int, str], Any]]:
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    return sorted(table.items(), key=lambda item: item[1][2], reverse=True)[:limit]


def _driver_time(stats: pstats.Stats) -> float:
    """Cumulative time of the DBAPI calls that talk to the database."""
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    wanted = ("execute", "executemany", "fetchone", "fetchall", "commit", "rollback")
    total = 0.0
    for (path, _line, name), entry in table.items():
        if path == "~":
            builtin = name.removeprefix("<method '").split("'")[0]
            if builtin in wanted and ("sqlite3.Cursor" in name or "sqlite3.Connection" in name):
                total += entry[3]
        elif (
            name in wanted
            and "psycopg" in Path(path).parts
            and Path(path).name in ("cursor.py", "connection.py")
        ):
            total += entry[3]
    return total
