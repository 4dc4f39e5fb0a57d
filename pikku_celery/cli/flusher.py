"""``pikku-celery flusher``: a node's flusher without a worker, for a machine that publishes
(a web host) and runs no prefork worker to write its hosted publishers' journals."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from pikku_celery.cli.app_loader import load_pikku
from pikku_celery.mirror import ENV_JOURNAL_DIR, Recorder
from pikku_celery.store import WorkflowStore, require_existing_database, safe_url

__all__ = ["add_flusher_command", "cmd_flusher"]


@contextmanager
def _mirror(args: argparse.Namespace) -> Iterator[Recorder]:
    """The app's mirror (its journal folder, and what it does after a COMMIT: chords fired,
    durable runs replayed), else one on ``--database-url`` and ``--journal-dir``."""
    if args.app:
        pikku = load_pikku(args.app, args.named_database_url)
        try:
            require_existing_database(pikku.store.engine.url)
            yield pikku.mirror
        finally:
            pikku.store.close()
            pikku.app.close()
        return
    require_existing_database(args.database_url)
    store = WorkflowStore(args.database_url)
    try:
        yield Recorder(store, journal_dir=args.journal_dir)
    finally:
        store.close()


def cmd_flusher(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    with _mirror(args) as mirror:
        folder = mirror.check_journal()
        mirror.serve_node()
        previous = {sig: signal.signal(sig, stopping) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            mirror.start()
            print(
                f"pikku-celery flusher: writing the journals in {folder} to "
                f"{safe_url(mirror.store.engine.url)}; SIGTERM or Ctrl-C stops it.",
                file=sys.stderr,
                flush=True,
            )
            while not stop.wait(1.0):
                pass
        finally:
            # What is due is written; a live publisher's journal is let go for the next node.
            mirror.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    print("pikku-celery flusher: stopped.", file=sys.stderr, flush=True)
    return 0


def add_flusher_command(commands: Any) -> None:
    flusher = commands.add_parser(
        "flusher",
        help="write this machine's hosted publishers' journals to SQL until stopped (--app)",
        description="A node's flusher without a worker: it writes the journals of the "
        'publishers on this machine set to pikku_publisher_journal = "node" (a web app that '
        "only appends), and those left by processes that ended, in group commits, until "
        "SIGTERM or Ctrl-C; then it writes what is due and lets go. A prefork worker on the "
        "same machine does the same already: run this on a machine that publishes and runs "
        "no worker. With --app, your app's journal folder and chords; else --database-url "
        "and --journal-dir.",
    )
    flusher.add_argument(
        "--journal-dir",
        type=Path,
        default=os.environ.get(ENV_JOURNAL_DIR) or None,
        help="the journal folder without --app (default ~/.local/state/pikku-celery/journal) "
        f"[env: {ENV_JOURNAL_DIR}]",
    )
    flusher.set_defaults(func=cmd_flusher)
