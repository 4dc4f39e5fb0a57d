"""``/metrics``: Prometheus text exposition of figures read from the database.

Everything is counted in SQL at scrape time, so the figures survive restarts
of the dashboard and agree across several of them. They are gauges: deleting
or pruning runs makes them go down.

Only counts, by status and by task (else step) name, are exposed: no run id,
input or output, which is why the endpoint stays open behind a password.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from pikku_celery.mirror import (
    default_journal_dir,
    journal_depth,
    journal_folder,
    unserved_journals,
)
from pikku_celery.store import (
    RUN_STATUSES,
    AttemptCount,
    AttemptTotals,
    OpenStepCounts,
    WorkflowStore,
    safe_url,
)

__all__ = ["CONTENT_TYPE", "collect_metrics", "escape_label", "format_metrics"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


def escape_label(value: str) -> str:
    """A label value as the exposition format wants it: \\, " and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


def _family(name: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]


def format_metrics(
    runs: Mapping[str, int],
    attempts: Iterable[AttemptCount],
    totals: AttemptTotals,
    oldest_running_age: float | None,
    *,
    open_steps: OpenStepCounts,
    stale_after: float,
    journal_events: int = 0,
    journals_unserved: int = 0,
) -> str:
    lines = _family("pikku_runs", "Workflow runs in the database, by status.")
    # Every status is listed, zero included, so a series never vanishes.
    for status in sorted(set(RUN_STATUSES) | set(runs)):
        lines.append(f'pikku_runs{{status="{escape_label(status)}"}} {runs.get(status, 0)}')
    lines += _family(
        "pikku_attempts",
        "Step attempts in the database, by task (rpc name, else step name) and status.",
    )
    for count in attempts:
        lines.append(
            f'pikku_attempts{{step="{escape_label(count.step)}",'
            f'status="{escape_label(count.status)}"}} {count.count}'
        )
    lines += _family("pikku_retry_attempts", "Attempts beyond the first of their step.")
    lines.append(f"pikku_retry_attempts {totals.retries}")
    lines += _family(
        "pikku_retry_ratio", "Attempts beyond the first of their step, over all attempts."
    )
    lines.append(f"pikku_retry_ratio {_number(totals.retry_ratio)}")
    lines += _family(
        "pikku_oldest_running_attempt_age_seconds",
        "Seconds since the oldest attempt still running started (0 when none is running).",
    )
    lines.append(f"pikku_oldest_running_attempt_age_seconds {_number(oldest_running_age or 0.0)}")
    lines += _family(
        "pikku_celery_steps_lost",
        "Steps whose attempt was lost with its worker and is neither redelivered nor retried "
        "yet; run `pikku-celery reap --app proj:pikku` (your app) if it does not go down.",
    )
    lines.append(f"pikku_celery_steps_lost {open_steps.lost}")
    threshold = _number(int(stale_after) if float(stale_after).is_integer() else stale_after)
    lines += _family(
        "pikku_celery_steps_scheduled_stale",
        f"Steps scheduled over {threshold} seconds ago (PIKKU_STALE_AFTER), ETA included, "
        "that no worker has started: is a worker consuming their queue?",
    )
    lines.append(f"pikku_celery_steps_scheduled_stale {open_steps.stale_scheduled}")
    lines += _family(
        "pikku_celery_journal_events",
        "Mirror events journaled on this machine (PIKKU_JOURNAL_DIR) and not written to SQL "
        "yet: a few for a few milliseconds, more while the database is away.",
    )
    lines.append(f"pikku_celery_journal_events {journal_events}")
    lines += _family(
        "pikku_celery_journals_unserved",
        "Journals of live hosted publishers on this machine (pikku_publisher_journal "
        '"node") that no process writes to SQL: start a prefork worker or `pikku-celery '
        "flusher --app proj:pikku` on this machine.",
    )
    lines.append(f"pikku_celery_journals_unserved {journals_unserved}")
    return "\n".join(lines) + "\n"


def collect_metrics(store: WorkflowStore, *, stale_after: float) -> str:
    # The journals of processes on the dashboard's machine (or a shared volume).
    folder = journal_folder(default_journal_dir(), safe_url(store.engine.url))
    return format_metrics(
        store.run_counts(),
        store.attempt_counts(),
        store.attempt_totals(),
        store.oldest_running_attempt_age(),
        open_steps=store.count_open_steps(stale_after),
        stale_after=stale_after,
        journal_events=journal_depth(folder.parent, only=folder.name),
        journals_unserved=unserved_journals(folder.parent, only=folder.name),
    )
