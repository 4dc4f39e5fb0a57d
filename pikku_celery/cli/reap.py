"""``pikku-celery reap``: one pass of the stuck-attempt reaper, for cron users."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from pikku_celery.cli.app_loader import user_app
from pikku_celery.cli.options import parse_age
from pikku_celery.integration.reaper import ReapReport

__all__ = ["add_reap_command", "cmd_reap", "format_reap"]


def cmd_reap(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {
        "idle_for": args.idle_for.total_seconds(),
        "stale_after": args.stale_after.total_seconds(),
        "reply_timeout": args.reply_timeout,
    }
    if args.deadline is not None:
        options["deadline"] = args.deadline.total_seconds()
    if args.redelivery_grace is not None:
        options["redelivery_grace"] = args.redelivery_grace.total_seconds()
    with user_app(args.app, "reap", args.named_database_url) as pikku:
        report = pikku.reap(**options)
    if args.json:
        print(json.dumps(report.as_dict(), ensure_ascii=False, indent=2))
    else:
        print(format_reap(report))
    return 0


def format_reap(report: ReapReport) -> str:
    lines = [
        f"Checked {report.checked} open attempts; workers answering: "
        f"{', '.join(report.workers) or 'none'}."
    ]
    for title, attempts in (
        ("Lost now", report.lost),
        ("Workflow steps dispatched again (their worker is gone)", report.redispatched),
        ("Published again as a new attempt", report.retried),
        ("Failed (no retries left, or nothing can publish it again)", report.failed),
    ):
        if attempts:
            lines.append(f"{title}:")
            lines.extend(
                f"  run {a.run_id}  step {a.step_name}  attempt {a.attempt}  "
                f"worker {a.worker or '-'}"
                for a in attempts
            )
    if report.awaiting_redelivery:
        lines.append("Waiting for Celery to redeliver:")
        for a in report.awaiting_redelivery:
            due = report.redelivery_due.get(a.step_id)
            when = (
                f"  due {due:%Y-%m-%d %H:%M:%S} UTC (the broker's visibility_timeout)"
                if due
                else ""
            )
            lines.append(
                f"  run {a.run_id}  step {a.step_name}  attempt {a.attempt}  "
                f"worker {a.worker or '-'}{when}"
            )
    if report.unsent_sent:
        lines.append("Claimed by a replay that died before sending them; sent now:")
        lines.extend(f"  run {c.run_id}  step {c.step_name}" for c in report.unsent_sent)
    if report.stale:
        lines.append(
            f"Scheduled but never picked up ({len(report.stale)}); check that a worker "
            "consumes their queue:"
        )
        lines.extend(
            f"  run {s.run_id}  step {s.step_name}  scheduled "
            f"{s.scheduled_at:%Y-%m-%d %H:%M:%S} UTC"
            if s.scheduled_at
            else f"  run {s.run_id}  step {s.step_name}"
            for s in report.stale
        )
    if len(lines) == 1:
        lines.append("Nothing is stuck.")
    return "\n".join(lines)


def add_reap_command(commands: Any, *, json_default: bool) -> None:
    reap = commands.add_parser(
        "reap",
        help="mark attempts of dead workers lost; report steps nobody picked up (--app)",
        description="Ask the workers which tasks they hold; an attempt that is running on "
        "no answering worker is lost: a durable workflow's step is dispatched again at once, "
        "anything else is redelivered by Celery if acks_late, else retried as a new attempt "
        "or failed. Workers run this themselves every pikku_reaper_interval seconds; this "
        "command is for a pass now. Safe to run on several machines at once.",
    )
    env = os.environ.get

    def age(name: str, default: str, text: str) -> None:
        reap.add_argument(
            f"--{name}",
            metavar="AGE",
            type=parse_age,
            default=env(f"PIKKU_REAP_{name.upper().replace('-', '_')}", default),
            help=f"{text} (default {default}) [env: PIKKU_REAP_{name.upper().replace('-', '_')}]",
        )

    age("idle-for", "30s", "look only at attempts running at least this long")
    reap.add_argument(
        "--redelivery-grace",
        metavar="AGE",
        type=parse_age,
        default=env("PIKKU_REAP_REDELIVERY_GRACE") or None,
        help="how long to wait for Celery to redeliver a lost attempt (default: the broker's "
        "visibility_timeout and 5 minutes) [env: PIKKU_REAP_REDELIVERY_GRACE]",
    )
    age("stale-after", "10m", "report scheduled steps older than this")
    reap.add_argument(
        "--deadline",
        metavar="AGE",
        type=parse_age,
        default=env("PIKKU_REAP_DEADLINE") or None,
        help="an attempt running longer than this is lost even on a live worker, and its "
        "task terminated (default: no deadline) [env: PIKKU_REAP_DEADLINE]",
    )
    reap.add_argument(
        "--reply-timeout",
        type=float,
        default=float(env("PIKKU_REAP_REPLY_TIMEOUT", "2")),
        help="seconds to wait for workers to answer (default 2) [env: PIKKU_REAP_REPLY_TIMEOUT]",
    )
    reap.add_argument("--json", action="store_true", default=json_default, help="print JSON")
    reap.set_defaults(func=cmd_reap)
