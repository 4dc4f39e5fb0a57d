"""The Debian PostgreSQL cluster tools the benches make servers of their own with.

``pg_createcluster``, ``pg_ctlcluster`` and ``pg_dropcluster`` run as root and make each
cluster the ``postgres`` user's. A failed command is a ``PgToolError`` naming the command
and the tail of what it printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Final

__all__ = ["PgToolError", "newest_postgres", "run_tool"]

_TIMEOUT: Final = 180.0
_TOOLS: Final = ("pg_createcluster", "pg_ctlcluster", "pg_dropcluster")


class PgToolError(RuntimeError):
    """A cluster tool is missing or failed; the message says which, and what to do."""


def run_tool(*command: str) -> str:
    """``command`` run to its end; its standard output, or ``PgToolError``."""
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        check=False,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    if done.returncode != 0:
        raise PgToolError(
            f"`{' '.join(command)}` exited {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return done.stdout


def newest_postgres(*also: str) -> str:
    """The newest PostgreSQL version installed, once the cluster tools (and ``also``) are
    on PATH."""
    for tool in (*_TOOLS, *also):
        if shutil.which(tool) is None:
            raise PgToolError(
                f"{tool} is not on PATH: install PostgreSQL and its cluster tools "
                "(apt-get install postgresql postgresql-server-dev-all), and run as root"
            )
    versions = os.listdir("/usr/lib/postgresql")
    return sorted(versions, key=lambda v: [int(p) for p in v.split(".")])[-1]
