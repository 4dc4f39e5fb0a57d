"""``pikku-celery runs``: list, show and delete runs; resume, rerun, cancel and send
them events through the user's app."""

from __future__ import annotations

import argparse
import os
from typing import Any, Final

from pikku_celery.cli.app_loader import user_app
from pikku_celery.cli.common import (
    EXIT_OK,
    add_json_option,
    env_help,
    print_json,
    reading_store_of,
    store_of,
)
from pikku_celery.cli.options import int_between, json_value, listed
from pikku_celery.errors import ConfigurationError, NotAWorkflowRun, RunNotFound
from pikku_celery.render.documents import run_document, run_json
from pikku_celery.render.text import format_run, format_runs

__all__ = ["add_runs_command"]

ENV_RUNS_STATUS: Final = "PIKKU_RUNS_STATUS"


def cmd_runs_list(args: argparse.Namespace) -> int:
    statuses = listed(args.status, ENV_RUNS_STATUS)
    store = reading_store_of(args)
    try:
        runs = store.list_runs(workflow=args.workflow, status=statuses, limit=args.limit)
        total = store.count_runs(workflow=args.workflow, status=statuses)
    finally:
        store.close()
    if args.json:
        print_json(
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
    store = reading_store_of(args)
    try:
        run = store.get_run(args.run_id)
        steps = store.list_step_states(args.run_id)
        history = store.get_run_history(args.run_id)
        events = store.list_events(args.run_id)
        states = store.result_states(s.step_id for s in steps)
    finally:
        store.close()
    if args.json:
        print_json(run_document(run, steps, history, events=events, celery_states=states))
    else:
        print(format_run(run, steps, history, events, states))
    return EXIT_OK


def cmd_runs_delete(args: argparse.Namespace) -> int:
    store = store_of(args)
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
        print_json(
            {"event_id": event_id, "run_id": args.run_id, "name": args.name, "data": args.data}
        )
    else:
        print(
            f"Sent event {args.name} to run {args.run_id} (event {event_id}); a "
            f"ctx.wait_for({args.name!r}) takes it when the run replays, now or once it gets "
            "there."
        )
    return EXIT_OK


def add_runs_command(commands: Any) -> None:
    runs = commands.add_parser(
        "runs", help="list, show, delete, resume, rerun or cancel runs, or send them events"
    )
    actions = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="the newest runs")
    listing.add_argument(
        "--status",
        action="append",
        metavar="STATUS",
        help=env_help("only runs in this status (repeat, or comma-separate)", ENV_RUNS_STATUS),
    )
    listing.add_argument(
        "--workflow",
        default=os.environ.get("PIKKU_RUNS_WORKFLOW") or None,
        help=env_help("only runs of this workflow", "PIKKU_RUNS_WORKFLOW"),
    )
    listing.add_argument(
        "--limit",
        type=int_between(1, 1000),
        default=os.environ.get("PIKKU_RUNS_LIMIT", "20"),
        help=env_help("how many runs, 1 to 1000 (default 20)", "PIKKU_RUNS_LIMIT"),
    )
    add_json_option(listing)
    listing.set_defaults(func=cmd_runs_list)

    show = actions.add_parser("show", help="one run: its steps and every attempt")
    show.add_argument("run_id", metavar="RUN_ID")
    add_json_option(show)
    show.set_defaults(func=cmd_runs_show)

    delete = actions.add_parser("delete", help="delete a run with its steps and attempts")
    delete.add_argument("run_id", metavar="RUN_ID")
    delete.set_defaults(func=cmd_runs_delete)

    resume = actions.add_parser("resume", help="new attempts for a run's failed steps (--app)")
    resume.add_argument("run_id", metavar="RUN_ID")
    resume.set_defaults(func=cmd_runs_resume)

    rerun = actions.add_parser("rerun", help="new attempts from one step of a run on (--app)")
    rerun.add_argument("run_id", metavar="RUN_ID")
    from_step = os.environ.get("PIKKU_RERUN_FROM_STEP") or None
    rerun.add_argument(
        "--from-step",
        metavar="NAME",
        default=from_step,
        required=from_step is None,
        help=env_help("the first step to run again", "PIKKU_RERUN_FROM_STEP"),
    )
    rerun.set_defaults(func=cmd_runs_rerun)

    cancel = actions.add_parser("cancel", help="cancel a run and revoke its open steps (--app)")
    cancel.add_argument("run_id", metavar="RUN_ID")
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
        help=env_help(
            "the event's data as JSON, quoted for the shell: --data '{\"approved\": true}' "
            "(default null)",
            "PIKKU_SEND_DATA",
        ),
    )
    add_json_option(send)
    send.set_defaults(func=cmd_runs_send)
