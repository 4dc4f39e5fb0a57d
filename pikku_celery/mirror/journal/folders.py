"""Where journals live: a root folder, a folder per database in it, and the names of
the journals there (one per process and mirror).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import Final

from pikku_celery.errors import ConfigurationError
from pikku_celery.store import database_key

__all__ = [
    "ENV_JOURNAL_DIR",
    "HOSTED_SUFFIX",
    "SUFFIX",
    "database_folder",
    "default_journal_dir",
    "journal_folder",
    "node_suffix",
    "probe_folder",
    "writable_folder",
]

ENV_JOURNAL_DIR: Final = "PIKKU_JOURNAL_DIR"
SUFFIX: Final = ".journal"
#: How a hosted journal's name ends: its publisher only appends, and any node's flusher of
#: its database on this machine may consume it while the publisher lives.
HOSTED_SUFFIX: Final = f"-hosted{SUFFIX}"


def default_journal_dir() -> Path:
    """``PIKKU_JOURNAL_DIR``, else the user's state folder, else the temp folder."""
    configured = os.environ.get(ENV_JOURNAL_DIR)
    if configured:
        return Path(configured)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    candidate = Path(state) / "pikku-celery" / "journal"
    try:
        candidate.mkdir(parents=True, exist_ok=True)
    except OSError:
        # A container user without a writable home still gets a journal.
        return Path(tempfile.gettempdir()) / f"pikku-celery-journal-{os.getuid()}"
    return candidate


def journal_folder(root: Path, database: str) -> Path:
    """The folder for one database, from its URL: a journal is only ever written into its
    own database, so two spellings of one database share a folder, and two databases
    spelled alike (a relative SQLite path in two projects) do not."""
    return database_folder(root, database_key(database))


def database_folder(root: Path, key: str) -> Path:
    """The folder for one database, from its :func:`database_key` (what a mirror holds
    already: its engine's URL is SQLAlchemy's, which this layer does not speak)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return root / digest


def probe_folder(folder: Path) -> None:
    """Make the folder and prove a file written there is durable (written, synced,
    removed); ``OSError`` says why it is not."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".probe-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(probe, "wb") as file:
            file.write(b"pikku-celery")
            file.flush()
            os.fsync(file.fileno())
    finally:
        with contextlib.suppress(FileNotFoundError):
            probe.unlink()


def writable_folder(folder: Path) -> Path:
    """``folder``, proven writable; ``ConfigurationError`` naming it if it is not.

    A process that cannot journal loses every event, so it finds out at once (a
    worker refuses to start), not one ERROR line per event later.
    """
    try:
        probe_folder(folder)
    except OSError as exc:
        raise ConfigurationError(
            f"pikku-celery cannot write its journal folder {folder} ({exc.strerror or exc}): "
            f"point {ENV_JOURNAL_DIR} (or app.conf.pikku_journal_dir) at a folder this "
            "process can write, on a local disk."
        ) from exc
    return folder


def node_suffix(node: int) -> str:
    """How the journals of the pool processes of node ``node`` (its main process's pid)
    end: it claims them as soon as they appear, and those of another node only once
    their owner is gone."""
    return f"-node{node}{SUFFIX}"
