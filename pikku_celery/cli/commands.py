"""The ``pikku-celery`` command: one function per subcommand, each a thin call into the package."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

from pikku_celery.cli.app_loader import ENV_APP, load_pikku, user_app
from pikku_celery.cli.journal import add_journal_command
from pikku_celery.cli.options import env_flag, int_between, json_value, listed, parse_age
from pikku_celery.cli.progress import Progress
from pikku_celery.cli.reap import add_reap_command
from pikku_celery.errors import (
    ConfigurationError,
    InvalidStatus,
    NotAWorkflowRun,
    PikkuCeleryError,
    RunNotFound,
)
from pikku_celery.render.documents import run_document, run_json
from pikku_celery.render.text import format_run, format_runs
from pikku_celery.store import (
    DEFAULT_DATABASE_URL,
    DEFAULT_PRUNE_STATUSES,
    ENV_DATABASE_URL,
    RUN_STATUSES,
    SETTLED_RUN_STATUSES,
    PruneCount,
    WorkflowStore,
    now,
    require_existing_database,
    safe_url,
)

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_SCHEMA_BEHIND: Final = 3

logger = logging.getLogger("pikku_celery.cli")


def _store(args: argparse.Namespace, *, creates: bool = False) -> WorkflowStore:
    """The store of ``--database-url``. Only a command that ``creates`` the database may
    start from nothing: SQLite would make an empty file for any mistyped path, and every
    other command would then report an empty database instead of a wrong path."""
    if not creates:
        require_existing_database(args.database_url)
    return WorkflowStore(args.database_url)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    store = _store(args, creates=True)
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
    from pikku_celery.demo.command import run_demo

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
    # With the user's app, resume, rerun, cancel and send can publish; they act on its database.
    pikku = load_pikku(args.app, args.named_database_url) if args.app else None
    if pikku is not None:
        require_existing_database(pikku.store.engine.url)
    store = pikku.store if pikku is not None else _store(args)
    try:
        app = create_app(store, actions=pikku, flower_url=args.flower_url, auth_token=password)
        if not password:
            mode = "read-only"
        elif pikku is not None:
            mode = "sign in to resume, rerun, cancel and delete runs, and send them events"
        else:
            mode = "sign in to delete runs; pass --app for resume, rerun, cancel and send event"
        print(f"pikku-celery dashboard on http://{args.host}:{args.port}/ ({mode})", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        store.close()
    return EXIT_OK


def cmd_healthcheck(args: argparse.Namespace) -> int:
    store = _store(args)
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


def _print_json(document: Any) -> None:
    print(json.dumps(document, ensure_ascii=False, indent=2))


def cmd_runs_list(args: argparse.Namespace) -> int:
    statuses = listed(args.status, ENV_RUNS_STATUS)
    store = _store(args)
    try:
        runs = store.list_runs(workflow=args.workflow, status=statuses, limit=args.limit)
        total = store.count_runs(workflow=args.workflow, status=statuses)
    finally:
        store.close()
    if args.json:
        _print_json(
            {
                "runs": [run_json(run) for run in runs],
                "total": total,
                "limit": args.limit,
                "status": statuses or [],
                "workflow": args.workflow,
            }
        )
    elif not runs:
        print("No runs match." if statuses or args.workflow else "No runs yet.")
    else:
        print(format_runs(runs))
        if total > len(runs):
            print(f"\n{len(runs)} of {total} runs, newest first; raise --limit to see more.")
    return EXIT_OK


def cmd_runs_show(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        run = store.get_run(args.run_id)
        steps = store.list_step_states(args.run_id)
        history = store.get_run_history(args.run_id)
        events = store.list_events(args.run_id)
    finally:
        store.close()
    if args.json:
        _print_json(run_document(run, steps, history, events=events))
    else:
        print(format_run(run, steps, history, events))
    return EXIT_OK


def cmd_runs_delete(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        if not store.delete_run(args.run_id):
            raise RunNotFound(args.run_id)
    finally:
        store.close()
    print(f"Deleted run {args.run_id} with its steps and attempts.")
    return EXIT_OK


def cmd_runs_resume(args: argparse.Namespace) -> int:
    with user_app(args.app, "runs resume", args.named_database_url) as pikku:
        run = pikku.store.get_run(args.run_id)
        if run.status == "completed":
            print(f"Run {run.run_id} is completed; nothing to resume.")
            return EXIT_OK
        again = pikku.resume(run.run_id)
    if again:
        print(f"Resumed run {run.run_id}: new attempts for {', '.join(again)}.")
    else:
        print(f"Resumed run {run.run_id}: no step had failed, so it is replayed as it is.")
    return EXIT_OK


def cmd_runs_rerun(args: argparse.Namespace) -> int:
    with user_app(args.app, "runs rerun", args.named_database_url) as pikku:
        run = pikku.store.get_run(args.run_id)
        names = [step.step_name for step in pikku.store.list_step_states(run.run_id)]
        if args.from_step not in names:
            raise ConfigurationError(
                f"Run {run.run_id} has no step {args.from_step!r}; its steps are "
                f"{', '.join(names) or 'none yet'}."
            )
        again = pikku.rerun(run.run_id, args.from_step)
    print(f"Rerunning run {run.run_id} from {args.from_step}: new attempts for {', '.join(again)}.")
    return EXIT_OK


def cmd_runs_cancel(args: argparse.Namespace) -> int:
    with user_app(args.app, "runs cancel", args.named_database_url) as pikku:
        run = pikku.store.get_run(args.run_id)
        if run.status not in ("running", "suspended"):
            print(f"Run {run.run_id} is {run.status} already; nothing to cancel.")
            return EXIT_OK
        stopped = pikku.cancel(run.run_id)
    revoked = f"; revoked {', '.join(stopped)}" if stopped else ""
    print(f"Cancelled run {run.run_id}{revoked}.")
    return EXIT_OK


def cmd_runs_send(args: argparse.Namespace) -> int:
    if not args.name.strip():
        raise ConfigurationError(
            "An event needs a name: the one the workflow's ctx.wait_for(NAME) waits for."
        )
    with user_app(args.app, "runs send", args.named_database_url) as pikku:
        try:
            event_id = pikku.send(args.run_id, args.name, args.data)
        except NotAWorkflowRun as exc:
            # The engine's message is about replays; a sender needs to hear about waits.
            raise ConfigurationError(
                f"Run {args.run_id} is not a durable workflow run, so nothing in it waits "
                "for events; send events to a @pikku.workflow run (`pikku-celery runs list` "
                "shows the runs)."
            ) from exc
    if args.json:
        _print_json(
            {"event_id": event_id, "run_id": args.run_id, "name": args.name, "data": args.data}
        )
    else:
        print(
            f"Sent event {args.name} to run {args.run_id} (event {event_id}); a "
            f"ctx.wait_for({args.name!r}) takes it when the run replays, now or once it gets "
            "there."
        )
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    statuses = listed(args.status, ENV_PRUNE_STATUS) or list(DEFAULT_PRUNE_STATUSES)
    try:
        before = now() - args.older_than
    except OverflowError:
        raise ConfigurationError(
            "--older-than reaches before year 1; give a smaller age."
        ) from None
    for status in statuses:  # a typo is reported before the database is even looked for
        if status not in SETTLED_RUN_STATUSES:
            kind = "prunable run" if status in RUN_STATUSES else "run"
            raise InvalidStatus(kind, status, SETTLED_RUN_STATUSES)
    scope = f"{'/'.join(sorted(set(statuses)))} runs created before {before:%Y-%m-%d %H:%M:%S} UTC"
    store = _store(args)
    try:
        if args.dry_run:
            found = store.count_prunable(before, statuses)
            print(f"Would prune {_tally(found)}: {scope}. Nothing was deleted (--dry-run).")
            return EXIT_OK
        batches = 0
        with Progress(store.count_prunable_runs(before, statuses), "runs") as bar:

            def committed(total: PruneCount) -> None:
                nonlocal batches
                batches += 1
                bar.update(total.runs)

            pruned = store.prune(before, statuses, batch_size=args.batch_size, on_batch=committed)
    finally:
        store.close()
    print(
        f"Pruned {_tally(pruned)}: {scope}, in {batches} "
        f"{'batch' if batches == 1 else 'batches'} of at most {args.batch_size} runs."
    )
    return EXIT_OK


def _tally(count: PruneCount) -> str:
    return f"{count.runs} runs ({count.steps} steps, {count.attempts} attempts)"


# --- options ----------------------------------------------------------------

ENV_JSON: Final = "PIKKU_JSON"
ENV_RUNS_STATUS: Final = "PIKKU_RUNS_STATUS"
ENV_PRUNE_STATUS: Final = "PIKKU_PRUNE_STATUS"
# The variable the demo app itself reads (demo/app.py, the Procfile, compose): one name.
ENV_DEMO_BROKER_URL: Final = "PIKKU_DEMO_BROKER_URL"


def _add_app_option(parser: argparse.ArgumentParser, *, default: Any) -> None:
    parser.add_argument(
        "--app",
        metavar="MODULE[:ATTR]",
        default=default,
        help=_env_help(
            "your Celery app's module and its PikkuCelery instance, like proj.tasks:pikku "
            "(default: the first PikkuCelery in the module); needed to publish. The app's "
            "database is used unless --database-url or PIKKU_DATABASE_URL names one: the app "
            "then gets that URL (as PIKKU_DATABASE_URL), and it is an error if the app names "
            "another database itself (PikkuCelery(app, database_url=...) or "
            "app.conf.pikku_database_url)",
            ENV_APP,
        ),
    )


def _add_runs_commands(commands: Any) -> None:
    runs = commands.add_parser(
        "runs", help="list, show, delete, resume, rerun or cancel runs, or send them events"
    )
    actions = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="the newest runs")
    listing.add_argument(
        "--status",
        action="append",
        metavar="STATUS",
        help=_env_help("only runs in this status (repeat, or comma-separate)", ENV_RUNS_STATUS),
    )
    listing.add_argument(
        "--workflow",
        default=os.environ.get("PIKKU_RUNS_WORKFLOW") or None,
        help=_env_help("only runs of this workflow", "PIKKU_RUNS_WORKFLOW"),
    )
    listing.add_argument(
        "--limit",
        type=int_between(1, 1000),
        default=os.environ.get("PIKKU_RUNS_LIMIT", "20"),
        help=_env_help("how many runs, 1 to 1000 (default 20)", "PIKKU_RUNS_LIMIT"),
    )
    _add_json_option(listing)
    listing.set_defaults(func=cmd_runs_list)

    show = actions.add_parser("show", help="one run: its steps and every attempt")
    show.add_argument("run_id", metavar="RUN_ID")
    _add_json_option(show)
    show.set_defaults(func=cmd_runs_show)

    delete = actions.add_parser("delete", help="delete a run with its steps and attempts")
    delete.add_argument("run_id", metavar="RUN_ID")
    delete.set_defaults(func=cmd_runs_delete)

    resume = actions.add_parser("resume", help="new attempts for a run's failed steps (--app)")
    resume.add_argument("run_id", metavar="RUN_ID")
    _add_app_option(resume, default=argparse.SUPPRESS)
    resume.set_defaults(func=cmd_runs_resume)

    rerun = actions.add_parser("rerun", help="new attempts from one step of a run on (--app)")
    rerun.add_argument("run_id", metavar="RUN_ID")
    from_step = os.environ.get("PIKKU_RERUN_FROM_STEP") or None
    rerun.add_argument(
        "--from-step",
        metavar="NAME",
        default=from_step,
        required=from_step is None,
        help=_env_help("the first step to run again", "PIKKU_RERUN_FROM_STEP"),
    )
    _add_app_option(rerun, default=argparse.SUPPRESS)
    rerun.set_defaults(func=cmd_runs_rerun)

    cancel = actions.add_parser("cancel", help="cancel a run and revoke its open steps (--app)")
    cancel.add_argument("run_id", metavar="RUN_ID")
    _add_app_option(cancel, default=argparse.SUPPRESS)
    cancel.set_defaults(func=cmd_runs_cancel)

    send = actions.add_parser(
        "send",
        help="send an event to a run's ctx.wait_for(NAME) (--app)",
        description="Send an event to a durable workflow run; the run is replayed, and a "
        "ctx.wait_for(NAME) takes the event, now or once the run gets there.",
    )
    send.add_argument("run_id", metavar="RUN_ID")
    send.add_argument("name", metavar="NAME", help="the event's name, as ctx.wait_for(NAME) has it")
    send.add_argument(
        "--data",
        metavar="JSON",
        type=json_value,
        default=os.environ.get("PIKKU_SEND_DATA") or None,
        help=_env_help(
            "the event's data as JSON, quoted for the shell: --data '{\"approved\": true}' "
            "(default null)",
            "PIKKU_SEND_DATA",
        ),
    )
    _add_json_option(send)
    _add_app_option(send, default=argparse.SUPPRESS)
    send.set_defaults(func=cmd_runs_send)


def _add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        default=env_flag(ENV_JSON),
        help=_env_help("print JSON (the dashboard API's documents)", ENV_JSON),
    )


def _add_prune_command(commands: Any) -> None:
    prune = commands.add_parser(
        "prune",
        help="delete old settled runs in batches",
        description="Delete runs that ended (completed, failed, cancelled) longer ago than "
        "--older-than, with their steps and attempts, one transaction per batch.",
    )
    older_than = os.environ.get("PIKKU_PRUNE_OLDER_THAN") or None
    prune.add_argument(
        "--older-than",
        metavar="AGE",
        type=parse_age,
        default=older_than,
        required=older_than is None,
        help=_env_help(
            "runs created longer ago than this: 30d, 12h, 90m, 45s", "PIKKU_PRUNE_OLDER_THAN"
        ),
    )
    prune.add_argument(
        "--status",
        action="append",
        metavar="STATUS",
        help=_env_help(
            "only runs in this status (repeat, or comma-separate; default "
            f"{', '.join(DEFAULT_PRUNE_STATUSES)})",
            ENV_PRUNE_STATUS,
        ),
    )
    prune.add_argument(
        "--batch-size",
        type=int_between(1, 100_000),
        default=os.environ.get("PIKKU_PRUNE_BATCH_SIZE", "500"),
        help=_env_help("runs per transaction (default 500)", "PIKKU_PRUNE_BATCH_SIZE"),
    )
    prune.add_argument(
        "--dry-run",
        action="store_true",
        default=env_flag("PIKKU_PRUNE_DRY_RUN"),
        help=_env_help("count what would go, delete nothing", "PIKKU_PRUNE_DRY_RUN"),
    )
    prune.set_defaults(func=cmd_prune)


def _env_help(text: str, env: str) -> str:
    return f"{text} [env: {env}]"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pikku-celery",
        description="A workflow backend for Celery: runs, steps and attempts in SQL.",
    )
    parser.add_argument(
        "--database-url",
        default=None,  # main() tells a URL that was given from the default (see --app)
        help=_env_help(
            f"database URL (default {DEFAULT_DATABASE_URL}); with --app, the app's "
            "PikkuCelery is pointed at it, and an app that names another database itself "
            "is an error",
            ENV_DATABASE_URL,
        ),
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show tracebacks and debug logs"
    )
    _add_app_option(parser, default=os.environ.get(ENV_APP) or None)
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
        default=os.environ.get(ENV_DEMO_BROKER_URL) or None,
        help=_env_help(
            "Celery broker URL (default: a temporary filesystem broker)", ENV_DEMO_BROKER_URL
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
        epilog="A password [env: PIKKU_DASHBOARD_PASSWORD] puts every page and /api/ "
        "document behind HTTP Basic sign-in (any user name) and turns on run actions; "
        "/healthz and /metrics stay open. Without one the dashboard is read-only and "
        "anyone who reaches it can read every run.",
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
    _add_app_option(dashboard, default=argparse.SUPPRESS)
    dashboard.set_defaults(func=cmd_dashboard)

    commands.add_parser(
        "healthcheck",
        help=f"exit 0 when the database is reachable and current ({EXIT_ERROR}: unreachable or "
        "none there, "
        f"{EXIT_SCHEMA_BEHIND}: schema behind)",
    ).set_defaults(func=cmd_healthcheck)
    _add_runs_commands(commands)
    _add_prune_command(commands)
    add_reap_command(commands, json_default=env_flag(ENV_JSON))
    add_journal_command(commands)
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
        if args.verbose:
            logger.exception("pikku-celery failed")
        print(
            f"error: {type(exc).__name__}: {_describe(exc)} (-v shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
