"""Where a step's time goes, from the timestamps the mirror stored on each attempt."""

from __future__ import annotations

import datetime as dt
import statistics
from dataclasses import dataclass, field
from typing import Any, Final

from bench.workflow.summary import KindSummary
from pikku_celery.store import StepAttempt


def ms(delta: dt.timedelta) -> float:
    return delta.total_seconds() * 1000


@dataclass
class Timeline:
    """Mean milliseconds of each part of a step, from the attempts' own timestamps."""

    parts: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.parts.setdefault(name, []).append(value)

    def mean(self, name: str) -> float:
        values = self.parts.get(name, [])
        return statistics.fmean(values) if values else float("nan")


TIMELINE_PARTS: Final = (
    "step to step",
    "orchestrate",
    "orchestrate, first quarter",
    "orchestrate, last quarter",
    "deliver",
    "run",
    "start to first step scheduled",
    "last step to run completed",
)


def timeline(store: Any, summary: KindSummary) -> Timeline:
    """Where a step's time goes, from steps 2..n (step 1 also carries the start).

    * ``step to step``: one step's success to the next one's;
    * workflow: ``orchestrate`` (a step's success to the next step's claim by
      the replay: the orchestrate message and the replay), ``deliver`` (claim
      to running: the step message and the running write) and ``run``
      (running to succeeded: the duplicate check, the task, the success write);
    * chain: ``deliver`` (the previous link's publish to running) and ``run``
      (which includes publishing the next link).
    """
    result = Timeline()
    quarter = max(1, summary.steps // 4)
    for run in summary.runs:
        attempts: list[StepAttempt] = sorted(
            store.get_run_history(run.run_id), key=lambda attempt: attempt.created_at
        )
        if not attempts:
            continue
        if attempts[0].scheduled_at is not None:
            result.add("start to first step scheduled", ms(attempts[0].scheduled_at - run.started))
        if attempts[-1].succeeded_at is not None:
            result.add("last step to run completed", ms(run.ended - attempts[-1].succeeded_at))
        for index in range(1, len(attempts)):
            previous, attempt = attempts[index - 1], attempts[index]
            done, scheduled = previous.succeeded_at, attempt.scheduled_at
            running, succeeded = attempt.running_at, attempt.succeeded_at
            if done is None or scheduled is None or running is None or succeeded is None:
                continue
            result.add("step to step", ms(succeeded - done))
            result.add("deliver", ms(running - scheduled))
            result.add("run", ms(succeeded - running))
            if summary.kind == "workflow":
                hop = ms(scheduled - done)
                result.add("orchestrate", hop)
                if index < quarter:
                    result.add("orchestrate, first quarter", hop)
                if index >= len(attempts) - quarter:
                    result.add("orchestrate, last quarter", hop)
    return result
