"""Each test's result in one mode, pytest's counts, and what differs from another mode."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Execution",
    "Outcome",
    "TestWindows",
    "counts",
    "differences",
    "executions_by_test",
    "extra_executions",
    "failing",
    "outcomes",
    "repeated_executions",
    "tally",
]

COUNT_KEYS = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "not run")


@dataclass
class Outcome:
    """One test: ``result`` is passed, failed, error (in setup), skipped, xfailed, xpassed
    or not run (no report: the session ended first); a teardown error is kept apart."""

    nodeid: str
    result: str = "not run"
    teardown_error: bool = False
    message: str = ""
    teardown_message: str = ""
    failed_subtests: list[str] = field(default_factory=list)
    start: float | None = None
    stop: float | None = None

    @property
    def label(self) -> str:
        return self.result + (" + teardown error" if self.teardown_error else "")


def outcomes(collected: Iterable[str], reports: Sequence[Mapping[str, Any]]) -> dict[str, Outcome]:
    found: dict[str, Outcome] = {nodeid: Outcome(nodeid) for nodeid in collected}
    for report in reports:
        nodeid = str(report["nodeid"])
        outcome = found.setdefault(nodeid, Outcome(nodeid))
        start, stop = float(report["start"]), float(report["stop"])
        outcome.start = start if outcome.start is None else min(outcome.start, start)
        outcome.stop = stop if outcome.stop is None else max(outcome.stop, stop)
        when, result, message = report["when"], report["outcome"], str(report["message"])
        if report["subtest"]:
            if result == "failed":
                outcome.failed_subtests.append(message.splitlines()[0] if message else "?")
            continue
        if when == "setup":
            if result == "failed":
                outcome.result, outcome.message = "error", message
            elif result == "skipped":
                outcome.result, outcome.message = "skipped", message
        elif when == "call":
            if report["wasxfail"]:
                outcome.result = "xfailed" if result == "skipped" else "xpassed"
            else:
                outcome.result = result
            outcome.message = message
        elif when == "teardown" and result == "failed":
            outcome.teardown_error = True
            outcome.teardown_message = message
    return found


def counts(results: Mapping[str, Outcome]) -> dict[str, int]:
    """As pytest counts: a teardown error is an error besides the test's own result."""
    counter = Counter(outcome.result for outcome in results.values())
    counter["error"] += sum(outcome.teardown_error for outcome in results.values())
    return {key: counter.get(key, 0) for key in COUNT_KEYS}


def failing(results: Mapping[str, Outcome]) -> list[str]:
    """The tests pytest counts as failed or in error (a teardown error included), sorted."""
    return sorted(
        nodeid
        for nodeid, outcome in results.items()
        if outcome.result in ("failed", "error") or outcome.teardown_error
    )


def tally(results: Mapping[str, Outcome], nodeids: Iterable[str]) -> dict[str, int]:
    """Counts (as :func:`counts`) of the collected tests whose node id, parameters left
    out, is one of ``nodeids``."""
    wanted = set(nodeids)
    return counts({key: o for key, o in results.items() if key.split("[", 1)[0] in wanted})


def differences(
    base: Mapping[str, Outcome], other: Mapping[str, Outcome]
) -> list[tuple[str, Outcome | None, Outcome | None]]:
    """Tests whose result (teardown errors included) is not the same in both."""
    rows = []
    for nodeid in sorted(set(base) | set(other)):
        a, b = base.get(nodeid), other.get(nodeid)
        if a is None or b is None or a.label != b.label:
            rows.append((nodeid, a, b))
    return rows


class TestWindows:
    """Which test was going on at a moment (from its first phase's start to its last's end)."""

    def __init__(self, results: Mapping[str, Outcome]) -> None:
        spans = sorted(
            (o.start, o.stop, o.nodeid)
            for o in results.values()
            if o.start is not None and o.stop is not None
        )
        self._starts = [span[0] for span in spans]
        self._spans = spans

    def at(self, moment: float | None) -> str:
        if moment is None:
            return "?"
        index = bisect.bisect_right(self._starts, moment) - 1
        if index < 0:
            return "(before the first test)"
        _, stop, nodeid = self._spans[index]
        return nodeid if moment <= stop else f"(after {nodeid})"


@dataclass(frozen=True)
class Execution:
    """A task body that ``task_prerun`` saw start more than once for one task id, task name
    and attempt. (``self.replace()`` gives the replacement the replaced task's id: a
    replacement by another task is not a repeat, one by the same task is.)"""

    task_id: str
    name: str
    retries: int
    times: int
    redelivered: int
    test: str


def _test_of(windows: TestWindows, moment: float) -> str:
    test = windows.at(moment)
    # A task that runs just after its test returned (its teardown done) is still its test's.
    return test[len("(after ") : -1] if test.startswith("(after ") else test


def repeated_executions(
    preruns: Sequence[Mapping[str, Any]], windows: TestWindows
) -> list[Execution]:
    by_key: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for record in preruns:
        key = (str(record["id"]), str(record["name"]), int(record["retries"] or 0))
        by_key.setdefault(key, []).append(record)
    repeated = []
    for (task_id, name, retries), records in sorted(by_key.items(), key=lambda kv: kv[1][0]["t"]):
        if len(records) > 1:
            repeated.append(
                Execution(
                    task_id=task_id,
                    name=name,
                    retries=retries,
                    times=len(records),
                    redelivered=sum(bool(r.get("redelivered")) for r in records),
                    test=_test_of(windows, float(records[0]["t"])),
                )
            )
    return repeated


def executions_by_test(
    preruns: Sequence[Mapping[str, Any]], windows: TestWindows
) -> dict[str, dict[str, int]]:
    """How many task bodies of each task started during each test."""
    found: dict[str, Counter[str]] = {}
    for record in preruns:
        test = _test_of(windows, float(record["t"]))
        found.setdefault(test, Counter())[str(record["name"])] += 1
    return {test: dict(sorted(c.items())) for test, c in sorted(found.items())}


def extra_executions(
    base: Mapping[str, Mapping[str, int]], other: Mapping[str, Mapping[str, int]]
) -> list[tuple[str, str, int, int]]:
    """(test, task, plain's count, this mode's) where the counts are not the same."""
    rows = []
    for test in sorted(set(base) | set(other)):
        mine, theirs = other.get(test, {}), base.get(test, {})
        for task in sorted(set(mine) | set(theirs)):
            if mine.get(task, 0) != theirs.get(task, 0):
                rows.append((test, task, theirs.get(task, 0), mine.get(task, 0)))
    return rows
