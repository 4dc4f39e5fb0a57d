"""The ``pikku-celery`` command: one function per subcommand, each a thin call into the package."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Final

from pikku_celery.errors import PikkuCeleryError
from pikku_celery.store import WorkflowStore
from pikku_celery.store.engine import DEFAULT_DATABASE_URL, ENV_DATABASE_URL, safe_url

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_SCHEMA_BEHIND: Final = 3

logger = logging.getLogger("pikku_celery.cli")


def _store(args: argparse.Namespace) -> WorkflowStore:
    return WorkflowStore(args.database_url)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    store = _store(args)
    before = store.schema_revision()
    store.init()
    after = store.schema_revision()
    if before == after:
        print(f"{safe_url(store.engine.url)} is already at revision {after}.")
    else:
        print(f"Upgraded {safe_url(store.engine.url)} from {before or 'empty'} to {after}.")
    store.close()
    return EXIT_OK


def _revisions(args: argparse.Namespace) -> tuple[str | None, str]:
    """The database's schema revision and the one this pikku-celery needs."""
    store = _store(args)
    try:
        return store.schema_revision(), store.latest_schema_revision()
    finally:
        store.close()


def cmd_db_current(args: argparse.Namespace) -> int:
    current, head = _revisions(args)
    print(f"current: {current or 'none (run `pikku-celery db upgrade`)'}")
    print(f"latest:  {head}")
    return EXIT_OK


def cmd_db_check(args: argparse.Namespace) -> int:
    current, head = _revisions(args)
    if current != head:
        print(
            f"The schema is at {current or 'none'}, this pikku-celery needs {head}; "
            "run `pikku-celery db upgrade`.",
            file=sys.stderr,
        )
        return EXIT_SCHEMA_BEHIND
    print(f"The schema is current ({head}).")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from pikku_celery.demo import run_demo

    return run_demo(
        database_url=args.demo_database_url or args.database_url, broker_url=args.broker_url
    )


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from pikku_celery.dashboard import create_app
    except ImportError as exc:  # the web stack is an optional extra
        print(
            f"error: the dashboard needs {exc.name or 'its extra dependencies'}. "
            "Run `pip install pikku-celery[dashboard]`.",
            file=sys.stderr,
        )
        return EXIT_ERROR
    password = os.environ.get("PIKKU_DASHBOARD_PASSWORD") or None
    store = _store(args)
    try:
        app = create_app(store, flower_url=args.flower_url, auth_token=password)
        mode = "sign in to delete runs" if password else "read-only"
        print(f"pikku-celery dashboard on http://{args.host}:{args.port}/ ({mode})", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        store.close()
    return EXIT_OK


def _env_help(text: str, env: str) -> str:
    return f"{text} [env: {env}]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pikku-celery",
        description="A workflow backend for Celery: runs, steps and attempts in SQL.",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get(ENV_DATABASE_URL, DEFAULT_DATABASE_URL),
        help=_env_help(f"database URL (default {DEFAULT_DATABASE_URL})", ENV_DATABASE_URL),
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show tracebacks and debug logs"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    db = commands.add_parser("db", help="manage the database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_commands.add_parser("upgrade", help="bring the schema to the latest revision").set_defaults(
        func=cmd_db_upgrade
    )
    db_commands.add_parser("current", help="show the schema revision").set_defaults(
        func=cmd_db_current
    )
    db_commands.add_parser(
        "check", help=f"exit {EXIT_SCHEMA_BEHIND} when the schema is behind"
    ).set_defaults(func=cmd_db_check)

    demo = commands.add_parser("demo", help="run a sample workflow and show its history")
    demo.add_argument(
        "--broker-url",
        default=os.environ.get("PIKKU_BROKER_URL"),
        help=_env_help(
            "Celery broker URL (default: a temporary filesystem broker)", "PIKKU_BROKER_URL"
        ),
    )
    demo.add_argument(
        "--database-url",
        dest="demo_database_url",
        default=None,
        help="database URL for the mirror (same as the global option)",
    )
    demo.set_defaults(func=cmd_demo)

    dashboard = commands.add_parser(
        "dashboard",
        help="serve the web dashboard, its JSON API and /metrics",
        epilog="Run actions need a password (HTTP Basic, any user name) "
        "[env: PIKKU_DASHBOARD_PASSWORD]; without one the dashboard is read-only.",
    )
    dashboard.add_argument(
        "--host",
        default=os.environ.get("PIKKU_DASHBOARD_HOST", "127.0.0.1"),
        help=_env_help("address to listen on (default 127.0.0.1)", "PIKKU_DASHBOARD_HOST"),
    )
    dashboard.add_argument(
        "--port",
        type=int,
        default=os.environ.get("PIKKU_DASHBOARD_PORT", "8000"),
        help=_env_help("port to listen on (default 8000)", "PIKKU_DASHBOARD_PORT"),
    )
    dashboard.add_argument(
        "--flower-url",
        default=os.environ.get("PIKKU_FLOWER_URL"),
        help=_env_help("Flower's address, to link every attempt to its task", "PIKKU_FLOWER_URL"),
    )
    dashboard.set_defaults(func=cmd_dashboard)
    return parser


def _describe(exc: BaseException) -> str:
    parts = [str(exc)]
    cause = exc.__cause__
    while cause is not None:
        text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        parts.append(f"{type(cause).__name__}: {text}")
        cause = cause.__cause__
    return " <- caused by ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except PikkuCeleryError as exc:
        if args.verbose:
            logger.exception("pikku-celery failed")
        print(f"error: {_describe(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
