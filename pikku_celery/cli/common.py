"""What every subcommand shares: exit codes, the store of ``--database-url``, JSON
output and the options that several subcommands take."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Final

from pikku_celery.cli.app_loader import ENV_APP
from pikku_celery.cli.options import env_flag
from pikku_celery.store import ENV_READ_DATABASE_URL, WorkflowStore, require_existing_database

__all__ = [
    "ENV_JSON",
    "EXIT_CANNOT_LISTEN",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_OUTPUT_CLOSED",
    "EXIT_SCHEMA_BEHIND",
    "EXIT_USAGE",
    "add_app_option",
    "add_json_option",
    "env_help",
    "print_json",
    "read_database_url",
    "reading_store_of",
    "store_of",
]

# Scripts and deploy checks tell outcomes apart by these; the README's "Command line" lists
# them, so a new one is added there too.
EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_SCHEMA_BEHIND: Final = 3
# The dashboard cannot listen at --host/--port: a port in use calls for another port, not
# for a look at the database, so a supervisor or script can tell the two apart.
EXIT_CANNOT_LISTEN: Final = 4
# The reader of stdout went away (`runs list | head`): 128 + SIGPIPE, what a shell reports
# for a command that SIGPIPE ended, so `set -o pipefail` scripts see what they expect.
EXIT_OUTPUT_CLOSED: Final = 141

ENV_JSON: Final = "PIKKU_JSON"


def store_of(args: argparse.Namespace, *, creates: bool = False) -> WorkflowStore:
    """The store of ``--database-url``. Only a command that ``creates`` the database may
    start from nothing: SQLite would make an empty file for any mistyped path, and every
    other command would then report an empty database instead of a wrong path."""
    if not creates:
        require_existing_database(args.database_url)
    return WorkflowStore(args.database_url)


def read_database_url(args: argparse.Namespace) -> str | None:
    """The read replica of ``--read-database-url``, else of ``PIKKU_READ_DATABASE_URL``."""
    return args.read_database_url or os.environ.get(ENV_READ_DATABASE_URL) or None


def reading_store_of(args: argparse.Namespace) -> WorkflowStore:
    """The store of a command that only reads: its reads go to the read replica when one
    is named, and anything it writes to ``--database-url``."""
    read_url = read_database_url(args)
    if read_url is None:
        return store_of(args)
    require_existing_database(args.database_url)
    require_existing_database(read_url)
    return WorkflowStore(args.database_url, read_url=read_url)


def print_json(document: Any) -> None:
    print(json.dumps(document, ensure_ascii=False, indent=2))


def add_app_option(parser: argparse._ActionsContainer, *, default: Any) -> None:
    parser.add_argument(
        "-A",
        "--app",
        metavar="MODULE[:ATTR]",
        default=default,
        help=env_help(
            "your Celery app's module and its PikkuCelery instance, like proj.tasks:pikku "
            "(default: the first PikkuCelery in the module); needed to publish. The app's "
            "database is used unless --database-url or PIKKU_DATABASE_URL names one: the app "
            "then gets that URL (as PIKKU_DATABASE_URL), and it is an error if the app names "
            "another database itself (PikkuCelery(app, database_url=...) or "
            "app.conf.pikku_database_url)",
            ENV_APP,
        ),
    )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        default=env_flag(ENV_JSON),
        help=env_help("print JSON (the dashboard API's documents)", ENV_JSON),
    )


def env_help(text: str, env: str) -> str:
    return f"{text} [env: {env}]"
