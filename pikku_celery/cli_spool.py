"""``pikku-celery spool``: what waits in this machine's spools, and replaying left-overs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pikku_celery.integration.mirror import CeleryMirror
from pikku_celery.store import WorkflowStore
from pikku_celery.store.engine import safe_url
from pikku_celery.store.spool import ENV_SPOOL_DIR, spool_depth

__all__ = ["add_spool_command", "cmd_spool"]


def cmd_spool(args: argparse.Namespace) -> int:
    store = WorkflowStore(args.database_url)
    mirror = CeleryMirror(store, spool_dir=args.spool_dir)
    folder = mirror.spool_folder
    try:
        waiting = spool_depth(folder.parent, only=folder.name)
        files = len(list(folder.glob("*.spool"))) if folder.is_dir() else 0
        print(
            f"{waiting} mirror events wait in {files} spool files in {folder} "
            f"(for {safe_url(store.engine.url)})."
        )
        if args.replay:
            written = mirror.adopt_orphans()
            left = spool_depth(folder.parent, only=folder.name)
            print(
                f"Replayed {written} events from spools of processes that ended; {left} still "
                "wait (a running worker's own spool, or the database is still away)."
            )
    finally:
        store.close()
    return 0


def add_spool_command(commands: Any) -> None:
    spool = commands.add_parser(
        "spool",
        help="events waiting for the database on this machine; --replay writes left-overs",
        description="While the database is unreachable, workers keep mirror events in a local "
        "spool and write them when it is back. A worker replays spools left by processes "
        "that ended when it starts; --replay does it now.",
    )
    spool.add_argument(
        "--spool-dir",
        type=Path,
        default=os.environ.get(ENV_SPOOL_DIR) or None,
        help=f"the spool folder (default ~/.local/state/pikku-celery/spool) [env: {ENV_SPOOL_DIR}]",
    )
    spool.add_argument(
        "--replay",
        action="store_true",
        help="write the events of spools whose process has ended",
    )
    spool.set_defaults(func=cmd_spool)
