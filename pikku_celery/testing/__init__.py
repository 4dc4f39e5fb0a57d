"""Run workflows and their steps in your own test process: no broker, no worker.

::

    from pikku_celery.testing import InlineRunner

    with InlineRunner(pikku) as runner:          # a temporary SQLite store by default
        run = runner.start(checkout, order_id=1)  # runs until nothing is due
        runner.advance(30)                        # the runner's clock: a 30 s sleep ends
        assert runner.result(run.run_id).status == "completed"

Messages with an ETA (retry delays, durable sleeps, the timeouts of waits) wait
for the runner's clock, which moves only with ``runner.advance(seconds)``, or by
itself with ``fast_forward=True``.

With pytest, the ``pikku_inline`` fixture is an open runner for the
``PikkuCelery`` your ``pikku_app`` fixture returns (see ``plugin``).
"""

from __future__ import annotations

from pikku_celery.testing.results import RunResult, StepResult
from pikku_celery.testing.runner import InlineRunner, inline

__all__ = ["InlineRunner", "RunResult", "StepResult", "inline"]
