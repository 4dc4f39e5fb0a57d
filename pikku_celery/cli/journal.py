"""``pikku-celery journal``: what waits in this machine's journals, and writing left-overs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pikku_celery.mirror import ENV_JOURNAL_DIR, SUFFIX, Recorder, journal_depth
from pikku_celery.store import WorkflowStore, require_existing_database, safe_url

__all__ = ["add_journal_command", "cmd_journal"]


def cmd_journal(args: argparse.Namespace) -> int:
    if args.replay:
        # Writing needs the tables: at a mistyped SQLite path, an empty file would take
        # the events instead of the database they were journaled for.
        require_existing_database(args.database_url)
    store = WorkflowStore(args.database_url)
    mirror = Recorder(store, journal_dir=args.journal_dir)
    try:
        # A folder that cannot be made is no "0 events": nothing could ever be journaled.
        folder = mirror.check_journal()
        waiting = journal_depth(folder.parent, only=folder.name)
        aside = journal_depth(folder.parent, only=folder.name, table="set_aside")
        files = len(list(folder.glob(f"*{SUFFIX}"))) if folder.is_dir() else 0
        print(
            f"{waiting} mirror events wait in {files} journal files in {folder} "
            f"(for {safe_url(store.engine.url)}); {aside} set aside."
        )
        if args.replay:
            written = mirror.adopt_orphans(set_aside_too=True)
            left = journal_depth(folder.parent, only=folder.name)
            print(
                f"Wrote {written} events from journals of processes that ended; {left} still "
                "wait (a running process's own journal, or the database is still away)."
            )
    finally:
        store.close()
    return 0


def add_journal_command(commands: Any) -> None:
    journal = commands.add_parser(
        "journal",
        aliases=["spool"],
        help="mirror events waiting for the database on this machine; --replay writes left-overs",
        description="Every process journals its mirror events on local disk and writes them to "
        "the database in batches. A live worker writes journals left by processes that ended "
        "within seconds; --replay does it now.",
    )
    journal.add_argument(
        "--journal-dir",
        type=Path,
        default=os.environ.get(ENV_JOURNAL_DIR) or None,
        help="the journal folder (default ~/.local/state/pikku-celery/journal) "
        f"[env: {ENV_JOURNAL_DIR}]",
    )
    journal.add_argument(
        "--replay",
        action="store_true",
        help="write the events of journals whose process has ended, set-aside ones too",
    )
    journal.set_defaults(func=cmd_journal)
