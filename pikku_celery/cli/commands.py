"""The ``pikku-celery`` command: its parser, the db, demo, dashboard and healthcheck
subcommands, and ``main``; the runs, prune, reap, journal and flusher subcommands have
modules of their own."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import select
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NoReturn

from pikku_celery import __version__
from pikku_celery.cli.app_loader import ENV_APP, load_pikku
from pikku_celery.cli.common import (
    ENV_JSON,
    EXIT_CANNOT_LISTEN,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OUTPUT_CLOSED,
    EXIT_SCHEMA_BEHIND,
    EXIT_USAGE,
    add_app_option,
    env_help,
    reading_store_of,
    store_of,
)
from pikku_celery.cli.flusher import add_flusher_command
from pikku_celery.cli.journal import add_journal_command
from pikku_celery.cli.options import env_flag, port_number
from pikku_celery.cli.prune import add_prune_command
from pikku_celery.cli.reap import add_reap_command
from pikku_celery.cli.runs import add_runs_command
from pikku_celery.errors import (
    PikkuCeleryError,
)
from pikku_celery.store import (
    DEFAULT_DATABASE_URL,
    ENV_DATABASE_URL,
    ENV_READ_DATABASE_URL,
    require_existing_database,
    safe_url,
)

__all__ = ["main"]


logger = logging.getLogger("pikku_celery.cli")


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    store = store_of(args, creates=True)
    try:
        if args.layout == "partitioned" and store.dialect != "postgresql":
            # Said before anything is written: the layout is the point of the command.
            store.partitions.convert()  # raises LayoutUnavailable
        before = store.schema_revision()
        store.init()
        after = store.schema_revision()
        where = safe_url(store.engine.url)
        if before == after:
            print(f"{where} is already at revision {after}.")
        else:
            print(f"Upgraded {where} from {before or 'empty'} to {after}.")
        if args.layout == "partitioned":
            print(f"Layout of {where}: {store.partitions.convert().describe()}.")
    finally:
        store.close()
    return EXIT_OK


def cmd_db_distribute(args: argparse.Namespace) -> int:
    store = store_of(args)
    try:
        laid_out = store.distribute(shard_count=args.shards)
    finally:
        store.close()
    where = safe_url(store.engine.url)
    if laid_out:
        print(f"Distributed on {where}: {', '.join(laid_out)}.")
    else:
        print(f"Every table of {where} is already distributed.")
    return EXIT_OK


def _revisions(args: argparse.Namespace) -> tuple[str | None, str]:
    """The database's schema revision and the one this pikku-celery needs."""
    store = store_of(args)
    try:
        return store.schema_revision(), store.latest_schema_revision()
    finally:
        store.close()


def cmd_db_current(args: argparse.Namespace) -> int:
    store = store_of(args)
    try:
        current, head = store.schema_revision(), store.latest_schema_revision()
        layout = store.partitions.layout() if current is not None else None
    finally:
        store.close()
    print(f"current: {current or 'none (run `pikku-celery db upgrade`)'}")
    print(f"latest:  {head}")
    if layout is not None:
        print(f"layout:  {layout}{_LAYOUT_NOTES[layout]}")
    return EXIT_OK


_LAYOUT_NOTES: Final = {
    "plain": "",
    "partitioned": " (run tables partitioned by day; see docs/scale.md)",
}


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
    from pikku_celery.demo.command import run_demo

    return run_demo(database_url=args.database_url, broker_url=args.broker_url)


class CannotListen(Exception):
    """The dashboard's address cannot be listened on; the message says what to change."""


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` and listening, before anything says it serves.

    uvicorn would bind only once it runs, after the address is printed, and then exit
    with its own code; binding here lets a taken port be one line and its own exit code.
    """
    where = f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise CannotListen(
            f"cannot listen on {where}: {host!r} is not an address of this machine "
            f"({exc.strerror}); give --host (or PIKKU_DASHBOARD_HOST) one, like 127.0.0.1 "
            "or 0.0.0.0 for every interface."
        ) from None
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn does: a port left in TIME_WAIT by a dashboard just stopped is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = (
                f"port {port} is in use (another dashboard, or another program); choose a free "
                "one with --port or PIKKU_DASHBOARD_PORT, or stop what holds it."
            )
        elif exc.errno == errno.EACCES:
            why = (
                f"port {port} needs privileges this user lacks; choose one from 1024 up with "
                "--port or PIKKU_DASHBOARD_PORT."
            )
        else:
            why = (
                f"{exc.strerror or exc}; check --host (PIKKU_DASHBOARD_HOST) and --port "
                "(PIKKU_DASHBOARD_PORT)."
            )
        raise CannotListen(f"cannot listen on {where}: {why}") from None
    return sock


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
    # With the user's app, resume, rerun, cancel and send can publish; they act on its database.
    pikku = load_pikku(args.app, args.named_database_url) if args.app else None
    if pikku is not None:
        require_existing_database(pikku.store.engine.url)
        # The option wins over the app's setting, which wins over the environment.
        if args.read_database_url:
            pikku.read_database_url = args.read_database_url
        store = pikku.read_store
    else:
        store = reading_store_of(args)
    try:
        app = create_app(store, actions=pikku, flower_url=args.flower_url, auth_token=password)
        try:
            sock = _listen(args.host, args.port)
        except CannotListen as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_CANNOT_LISTEN
        with sock:
            if not password:
                mode = "read-only"
            elif pikku is not None:
                mode = "sign in to resume, rerun, cancel and delete runs, and send them events"
            else:
                mode = "sign in to delete runs; pass --app for resume, rerun, cancel and send event"
            if store.replica is not None:
                mode += f"; reading the replica {safe_url(store.replica.engine.url)}"
            # The port bound, which --port 0 leaves to the system.
            port = sock.getsockname()[1]
            host = f"[{args.host}]" if ":" in args.host else args.host
            print(f"pikku-celery dashboard on http://{host}:{port}/ ({mode})", flush=True)
            config = uvicorn.Config(app, host=args.host, port=port, log_level="warning")
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        store.close()
    return EXIT_OK


def cmd_healthcheck(args: argparse.Namespace) -> int:
    store = store_of(args)
    try:
        current = store.schema_revision()  # a real query: StoreUnavailable when unreachable
        head = store.latest_schema_revision()
    finally:
        store.close()
    where = safe_url(store.engine.url)
    if current != head:
        print(
            f"unhealthy: {where} is reachable but its schema is at {current or 'none'} and "
            f"this pikku-celery needs {head}; run `pikku-celery db upgrade`.",
            file=sys.stderr,
        )
        return EXIT_SCHEMA_BEHIND
    print(f"ok: {where} is reachable and its schema is current ({head}).")
    return EXIT_OK


# --- options ----------------------------------------------------------------

# The variable the demo app itself reads (demo/app.py, the Procfile, compose): one name.
ENV_DEMO_BROKER_URL: Final = "PIKKU_DEMO_BROKER_URL"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pikku-celery",
        description="A workflow backend for Celery: runs, steps and attempts in SQL.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_global_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    db = commands.add_parser("db", help="manage the database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_commands.add_parser("upgrade", help="bring the schema to the latest revision")
    upgrade.add_argument(
        "--layout",
        choices=("plain", "partitioned"),
        default="plain",
        help="plain (default): the tables as they are; partitioned: then lay the run tables "
        "out by day (PostgreSQL; retention by dropping a day's partitions, see "
        "docs/scale.md). A database already partitioned stays so",
    )
    upgrade.set_defaults(func=cmd_db_upgrade)
    distribute = db_commands.add_parser(
        "distribute", help="lay the tables out on a Citus cluster (run on its coordinator)"
    )
    distribute.add_argument(
        "--shards", type=int, default=None, help="shards per table (default: citus.shard_count)"
    )
    distribute.set_defaults(func=cmd_db_distribute)
    db_commands.add_parser("current", help="show the schema revision").set_defaults(
        func=cmd_db_current
    )
    db_commands.add_parser(
        "check", help=f"exit {EXIT_SCHEMA_BEHIND} when the schema is behind"
    ).set_defaults(func=cmd_db_check)

    demo = commands.add_parser("demo", help="run a sample workflow and show its history")
    demo.add_argument(
        "--broker-url",
        default=os.environ.get(ENV_DEMO_BROKER_URL) or None,
        help=env_help(
            "Celery broker URL (default: a temporary filesystem broker)", ENV_DEMO_BROKER_URL
        ),
    )
    demo.set_defaults(func=cmd_demo)

    dashboard = commands.add_parser(
        "dashboard",
        help="serve the web dashboard, its JSON API and /metrics",
        epilog="A password [env: PIKKU_DASHBOARD_PASSWORD] puts every page and /api/ "
        "document behind HTTP Basic sign-in (any user name) and turns on run actions; "
        "/healthz, /readyz and /metrics stay open. Without one the dashboard is read-only and "
        "anyone who reaches it can read every run.",
    )
    dashboard.add_argument(
        "--host",
        default=os.environ.get("PIKKU_DASHBOARD_HOST", "127.0.0.1"),
        help=env_help("address to listen on (default 127.0.0.1)", "PIKKU_DASHBOARD_HOST"),
    )
    dashboard.add_argument(
        "--port",
        type=port_number("--port", "PIKKU_DASHBOARD_PORT"),
        default=os.environ.get("PIKKU_DASHBOARD_PORT", "8000"),
        help=env_help(
            f"port to listen on (default 8000; 0: any free one); exit {EXIT_CANNOT_LISTEN} when "
            "it cannot be listened on",
            "PIKKU_DASHBOARD_PORT",
        ),
    )
    dashboard.add_argument(
        "--flower-url",
        default=os.environ.get("PIKKU_FLOWER_URL"),
        help=env_help("Flower's address, to link every attempt to its task", "PIKKU_FLOWER_URL"),
    )
    dashboard.set_defaults(func=cmd_dashboard)

    commands.add_parser(
        "healthcheck",
        help=f"exit 0 when the database is reachable and current ({EXIT_ERROR}: unreachable or "
        "none there, "
        f"{EXIT_SCHEMA_BEHIND}: schema behind)",
    ).set_defaults(func=cmd_healthcheck)
    add_runs_command(commands)
    add_prune_command(commands)
    add_reap_command(commands, json_default=env_flag(ENV_JSON))
    add_journal_command(commands)
    add_flusher_command(commands)
    for command in _commands_of(parser):
        _add_global_options(command, top=False)
    return parser


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--database-url``, ``-v`` and ``--app``, before the command or after it.

    Messages suggest commands like ``pikku-celery db upgrade --database-url ...``, and
    people add an option where the command ends: both spellings must mean the same. On a
    command the options default to nothing at all (``SUPPRESS``), so one given before
    the command is not undone by the command's own default.
    """
    unset: Any = argparse.SUPPRESS
    where: argparse._ActionsContainer = (
        parser if top else parser.add_argument_group("global options (before or after the command)")
    )
    where.add_argument(
        "--database-url",
        default=None if top else unset,  # main() tells a URL that was given from the default
        help=env_help(
            f"database URL (default {DEFAULT_DATABASE_URL}); with --app, the app's "
            "PikkuCelery is pointed at it, and an app that names another database itself "
            "is an error",
            ENV_DATABASE_URL,
        ),
    )
    where.add_argument(
        "--read-database-url",
        default=None if top else unset,
        help=env_help(
            "a streaming replica of the database, for what the dashboard, its /metrics, "
            "`runs list` and `runs show` read (default: the database itself; with --app, the "
            "app's pikku_read_database_url); writes never go there",
            ENV_READ_DATABASE_URL,
        ),
    )
    where.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else unset,
        help="show tracebacks and debug logs",
    )
    add_app_option(where, default=(os.environ.get(ENV_APP) or None) if top else unset)


def _commands_of(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every command and subcommand under ``parser``, each once (an alias is the same one)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in {id(p): p for p in action.choices.values()}.values():
                yield command
                yield from _commands_of(command)


def _describe(exc: BaseException) -> str:
    parts = [str(exc)]
    cause = exc.__cause__
    while cause is not None:
        text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        parts.append(f"{type(cause).__name__}: {text}")
        cause = cause.__cause__
    return " <- caused by ".join(parts)


def _output_gone() -> bool:
    """Whether stdout is a pipe whose reader has gone (``| head`` read its fill).

    A BrokenPipeError can also come from a socket (a broker's), which is an error to
    report; only a reader that left is the end of the output everyone expects.
    """
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):  # no real stdout, or no poll (Windows)
        return not hasattr(select, "poll")
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _quiet_stdout() -> int:
    # What is still buffered would fail again as the interpreter exits, with "Exception
    # ignored ... BrokenPipeError" on stderr: it goes to /dev/null instead.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return EXIT_OUTPUT_CLOSED


def main(argv: Sequence[str] | None = None) -> int:
    """The command; a reader that closes our output early (``| head``) ends it quietly,
    with ``EXIT_OUTPUT_CLOSED``, as a command killed by SIGPIPE in a shell."""
    try:
        code = _main(argv)
        # Buffered output meets a closed reader here, not at interpreter exit.
        sys.stdout.flush()
    except BrokenPipeError:
        return _quiet_stdout()
    except SystemExit:  # --help and usage errors: their text may still be buffered
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise SystemExit(_quiet_stdout()) from None
        raise
    return code


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    # A URL the user gave (option or variable), as opposed to the default: only a given one
    # is handed to --app's PikkuCelery, which has a default of its own.
    args.named_database_url = args.database_url or os.environ.get(ENV_DATABASE_URL) or None
    args.database_url = args.named_database_url or DEFAULT_DATABASE_URL
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
    except Exception as exc:  # a dependency's error (a broker that is down): still one line
        if isinstance(exc, BrokenPipeError) and _output_gone():
            raise
        if args.verbose:
            logger.exception("pikku-celery failed")
        print(
            f"error: {type(exc).__name__}: {_describe(exc)} (-v shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
