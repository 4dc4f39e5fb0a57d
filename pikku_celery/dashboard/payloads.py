"""What the pages show, as JSON-ready dicts for ``/api/``; and the links both share.

The documents live in ``pikku_celery.payloads`` so ``pikku-celery runs show
--json`` prints the same ones without the dashboard extra.
"""

from __future__ import annotations

from pikku_celery.payloads import (
    attempt_json,
    attempts_by_step,
    event_json,
    flower_task_url,
    run_document,
    run_json,
    run_parent,
    step_json,
    step_wait,
)

__all__ = [
    "attempt_json",
    "attempts_by_step",
    "event_json",
    "flower_task_url",
    "run_document",
    "run_json",
    "run_parent",
    "step_json",
    "step_wait",
]
