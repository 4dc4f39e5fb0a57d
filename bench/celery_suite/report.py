"""A mode's results as one JSON document (``summary.json``), and that document as text."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.celery_suite.gates import GATE_MESSAGES, redis_internals
from bench.celery_suite.mirror_check import MirrorState, open_by_task
from bench.celery_suite.outcomes import (
    Outcome,
    TestWindows,
    counts,
    differences,
    executions_by_test,
    extra_executions,
    failing,
    outcomes,
    repeated_executions,
    tally,
)
from bench.celery_suite.session import ModeRun

__all__ = ["MirrorReading", "classify", "load_baseline", "render", "summarize"]

#: Celery's embedded worker waits 10 s (shutdown_timeout) for its thread; a stop close to
#: that is a hang, whether or not it ended in time.
WORKER_STOP_HANG: Final = 8.0
#: Longest list printed (summary.json has them all).
LIST_LIMIT: Final = 40
#: From pytest's last hook to the process's exit (atexit handlers, threads that hold it).
EXIT_HANG: Final = 5.0
DESCRIPTION: Final = {
    "plain": "no pikku-celery",
    "all": 'PikkuCelery(app, database_url=..., mirror="all") on both test apps',
    "steps": "PikkuCelery(app, database_url=...) (mirror='steps', the default) on both test apps",
    "backend": 'PikkuCelery(app, database_url=..., mirror="all") on both test apps, and '
    "pikku-celery's result backend (TEST_BACKEND) on the same database",
}
#: The class a backend mode's apps must have as their result backend.
PIKKU_BACKEND_CLASS: Final = "pikku_celery.integration.backend.PikkuBackend"
_BAD: Final = frozenset({"failed", "error"})


@dataclass(frozen=True)
class MirrorReading:
    """The mirror's database as the session left it, and after replaying its journals."""

    left: MirrorState
    journal_before: str  # `pikku-celery journal`: what the session's journals still held
    replayed: str  # `pikku-celery journal --replay`
    after: MirrorState


def _span(session: dict[str, Any], start: str, end: str) -> float | None:
    if start in session and end in session:
        return round(float(session[end]) - float(session[start]), 2)
    return None


def _outcome_doc(outcome: Outcome) -> dict[str, Any]:
    return {
        "result": outcome.label,
        "message": outcome.message.splitlines()[0][:300] if outcome.message else "",
        "teardown_message": outcome.teardown_message.splitlines()[0][:300]
        if outcome.teardown_message
        else "",
        "failed_subtests": outcome.failed_subtests,
    }


def _open_step_doc(windows: TestWindows, state: MirrorState) -> list[dict[str, Any]]:
    return [
        {
            "task": step.task,
            "step_name": step.step_name,
            "status": step.status,
            "attempt": step.attempt,
            "reason": step.reason,
            "run_status": step.run_status,
            "workflow": step.workflow,
            "step_id": step.step_id,
            "test": windows.at(step.created_at),
        }
        for step in state.open_steps
    ]


def classify(nodeid: str, plain: str, mine: str, message: str, gated: bool) -> str:
    """Why a test's result differs from plain, as far as the suite's own text tells."""
    bad = mine.split(" + ", 1)[0] in _BAD or mine.endswith("teardown error")
    internal = redis_internals(nodeid)
    if internal is not None and bad:
        return f"asserts Redis internals: {internal}"
    if mine == "skipped" and message in GATE_MESSAGES:
        return "skipped: requires a result_backend starting with 'redis' (gates closed)"
    where = "a redis-gated test" if gated else "not gated"
    if plain.split(" + ", 1)[0] in _BAD and not bad:
        return f"fails plain, not here ({where})"
    if bad:
        return f"fails here, not plain ({where})"
    return f"differs ({where})"


def _results_doc(run: ModeRun, state: MirrorState | None) -> dict[str, Any]:
    """The backend mode: which result backend the apps and the task bodies had, and what
    landed in the store's result tables."""
    session = run.session
    apps: dict[str, dict[str, int]] = session.get("backends") or {}
    bodies = dict(Counter(str(r.get("backend")) for r in run.preruns).most_common())
    classes = {name for found in apps.values() for name in found} | set(bodies)
    rows = sum(state.results.values()) if state is not None else 0
    return {
        "test_backend": session.get("result_backend"),
        "apps": apps,
        "task_bodies": bodies,
        "results": {} if state is None else state.results,
        "groups": 0 if state is None else state.result_groups,
        "chords": {} if state is None else state.result_chords,
        "is_pikku": bool(classes) and classes == {PIKKU_BACKEND_CLASS} and rows > 0,
    }


def _mirror_doc(windows: TestWindows, state: MirrorState) -> dict[str, Any]:
    return {
        "runs": state.runs,
        "steps": state.steps,
        "attempts": state.attempts,
        "attempt_reasons": state.reasons,
        "open_steps_by_task": open_by_task(state),
        "open_steps": _open_step_doc(windows, state),
        "open_runs_by_workflow": state.open_runs,
        "failed_runs_without_failed_step": [
            {
                "workflow": run.workflow,
                "run_id": run.run_id,
                "error": run.error[:300],
                "step_statuses": run.step_statuses,
                "test": windows.at(run.created_at),
            }
            for run in state.failed_runs_no_failed_step
        ],
        "attempts_delivered_more_than_once": [
            {"step_id": a, "task": b, "attempt": c, "delivery_count": d, "status": e}
            for a, b, c, d, e in state.redelivered_attempts
        ],
    }


def summarize(
    run: ModeRun,
    mirror: MirrorReading | None,
    baseline: dict[str, Any] | None,
    gated: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """``gated``: node ids (without parameters) of the tests that skip themselves unless
    the result backend's URL starts with ``redis``."""
    session = run.session
    results = outcomes(session.get("collected", []), run.reports)
    windows = TestWindows(results)
    first_start = min((o.start for o in results.values() if o.start is not None), default=None)
    worker_stop = _span(session, "worker_teardown_started_at", "worker_teardown_ended_at")
    exit_lag = (
        round(run.ended - float(session["unconfigure_at"]), 2)
        if "unconfigure_at" in session
        else None
    )
    hang_reasons = []
    if run.timed_out:
        hang_reasons.append("the session was killed at its timeout")
    if run.worker_stuck_lines:
        hang_reasons.append(f"'Worker thread failed to exit' x{run.worker_stuck_lines}")
    if worker_stop is None and not run.timed_out and "collected" in session:
        hang_reasons.append("the embedded worker's teardown did not finish")
    if worker_stop is not None and worker_stop >= WORKER_STOP_HANG:
        hang_reasons.append(f"stopping the embedded worker took {worker_stop} s")
    if exit_lag is not None and exit_lag >= EXIT_HANG:
        hang_reasons.append(f"the process exited {exit_lag} s after pytest's last hook")
    repeated = repeated_executions(run.preruns, windows)
    doc: dict[str, Any] = {
        "mode": run.mode,
        "description": DESCRIPTION[run.mode],
        "folder": str(run.folder),
        "database_url": run.database_url,
        "returncode": run.returncode,
        "pytest_summary": run.summary_line,
        "counts": counts(results),
        "timing": {
            "session_s": round(run.seconds, 2),
            "start_to_first_test_s": None
            if first_start is None
            else round(first_start - run.started, 2),
            "tests_s": None
            if first_start is None or "settle_started_at" not in session
            else round(float(session["settle_started_at"]) - first_start, 2),
            "settle_s": _span(session, "settle_started_at", "settle_ended_at"),
            "worker_stop_s": worker_stop,
            "exit_after_last_hook_s": exit_lag,
        },
        "timed_out": run.timed_out,
        "hung_at_teardown": bool(hang_reasons),
        "hang_reasons": hang_reasons,
        "worker_stuck_lines": run.worker_stuck_lines,
        "leftover_processes": run.leftover_processes,
        "threads_alive_at_end": session.get("threads_alive"),
        "pikku_celery_imported": session.get("pikku_celery_imported"),
        "installed": session.get("installed"),
        "notes": run.notes,
        "task_executions": len(run.preruns),
        "executions_by_test": executions_by_test(run.preruns, windows),
        "repeated_executions": [
            {
                "task": e.name,
                "task_id": e.task_id,
                "attempt": e.retries + 1,
                "times": e.times,
                "redelivered": e.redelivered,
                "test": e.test,
            }
            for e in repeated
        ],
        "pikku_log": dict(
            Counter(
                f"{r['level']} {r.get('action') or r['message'][:80]}" for r in run.pikku_logs
            ).most_common()
        ),
        "outcomes": {nodeid: _outcome_doc(o) for nodeid, o in sorted(results.items())},
        "failed": failing(results),
        "gated": {
            "counts": tally(results, gated),
            "failed": [n for n in failing(results) if n.split("[", 1)[0] in gated],
        },
    }
    if run.mode == "backend":
        doc["result_backend"] = _results_doc(run, None if mirror is None else mirror.left)
    if mirror is not None:
        left = _mirror_doc(windows, mirror.left)
        left["journal_after_exit"] = mirror.journal_before
        left["journal_replay"] = mirror.replayed
        after = _mirror_doc(windows, mirror.after)
        left["after_replay"] = {
            key: after[key]
            for key in ("runs", "steps", "open_steps_by_task", "failed_runs_without_failed_step")
        }
        repeated_ids = {e.task_id for e in repeated}
        left["repeated_executions_mirrored"] = len(repeated_ids & mirror.left.step_ids)
        doc["mirror"] = left
    if baseline is not None:
        doc["baseline"] = baseline["folder"]
        base = {
            nodeid: Outcome(nodeid, result=o["result"])
            for nodeid, o in baseline["outcomes"].items()
        }
        mine = {
            nodeid: Outcome(nodeid, result=o["result"]) for nodeid, o in doc["outcomes"].items()
        }
        # A test this mode did not collect (a -k or --tests subset) is left out of it.
        doc["not_collected_here"] = len(set(base) - set(mine))
        doc["differs_from_plain"] = [
            {
                "test": nodeid,
                "plain": "absent" if a is None else a.result,
                run.mode: b.result,
                "why": classify(
                    nodeid,
                    "absent" if a is None else a.result,
                    b.result,
                    doc["outcomes"][nodeid]["message"],
                    nodeid.split("[", 1)[0] in gated,
                ),
                "message": doc["outcomes"].get(nodeid, {}).get("message", ""),
                "teardown_message": doc["outcomes"].get(nodeid, {}).get("teardown_message", ""),
            }
            for nodeid, a, b in differences(base, mine)
            if b is not None
        ]
        doc["plain_failed"] = [n for n in baseline.get("failed", []) if n in mine]
        doc["plain_repeated_executions"] = len(baseline["repeated_executions"])
        doc["plain_task_executions"] = baseline["task_executions"]
        doc["executions_differing_from_plain"] = [
            {"test": test, "task": task, "plain": a, run.mode: b}
            for test, task, a, b in extra_executions(
                {
                    test: found
                    for test, found in baseline["executions_by_test"].items()
                    if test in mine or test not in base  # "(before the first test)", "?"
                },
                doc["executions_by_test"],
            )
        ]
    return doc


def load_baseline(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if data.get("mode") != "plain":
        raise SystemExit(f"{path} is the summary of mode {data.get('mode')!r}, not of plain")
    return data


def _by_task(rows: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(str(row["task"]).rsplit(".", 1)[-1] for row in rows).most_common())


def _one_line(text: str) -> str:
    return " / ".join(line.strip() for line in text.splitlines() if line.strip())


def _counts_line(found: dict[str, int]) -> str:
    return ", ".join(f"{key} {n}" for key, n in found.items())


def _dict_line(found: dict[str, int]) -> str:
    return ", ".join(f"{key} {n}" for key, n in found.items()) or "none"


def render(doc: dict[str, Any]) -> str:
    out: list[str] = []
    add = out.append
    timing = doc["timing"]
    add(f"== mode {doc['mode']}: {doc['description']}")
    add(f"   folder {doc['folder']}")
    if doc["database_url"]:
        add(f"   mirror database {doc['database_url']}")
    if "pikku" in doc:
        pikku = doc["pikku"]
        add(f"   pikku-celery: {pikku['label']}, imported from {pikku['imported_from']}")
    add(f"   pytest exit code {doc['returncode']}; pytest says: {doc['pytest_summary'] or '-'}")
    add(f"   counts: {_counts_line(doc['counts'])}")
    add(
        f"   time: session {timing['session_s']} s (tests {timing['tests_s']} s, "
        f"settle {timing['settle_s']} s, stopping the worker {timing['worker_stop_s']} s, "
        f"exit after pytest's last hook {timing['exit_after_last_hook_s']} s)"
    )
    verdict = "yes: " + "; ".join(doc["hang_reasons"]) if doc["hung_at_teardown"] else "no"
    add(f"   hung at teardown: {verdict}")
    if doc["leftover_processes"]:
        add(f"   processes left behind: {doc['leftover_processes']}")
    add(f"   threads alive at the end: {', '.join(doc['threads_alive_at_end'] or []) or 'none'}")
    add(f"   pikku_celery imported: {doc['pikku_celery_imported']}; installs {doc['installed']}")
    for note in doc["notes"]:
        add(f"   note: {note}")
    backend = doc.get("result_backend")
    if backend is not None:
        verdict = "yes" if backend["is_pikku"] else "NO"
        add(f"   result backend is PikkuBackend, results in pikku_celery_results: {verdict}")
        add(f"     TEST_BACKEND {backend['test_backend']}")
        for fixture, found in backend["apps"].items():
            add(f"     {fixture}: {_dict_line(found)}")
        add(f"     task bodies ran with: {_dict_line(backend['task_bodies'])}")
        add(
            f"     pikku_celery_results: {_dict_line(backend['results'])}; groups "
            f"{backend['groups']}; chords {_dict_line(backend['chords'])}"
        )
    failed = doc.get("failed", [])
    add(f"   failed or in error ({len(failed)}):")
    for nodeid in failed:
        add(f"     {nodeid}")
    gated = doc.get("gated")
    if gated is not None:
        add(
            "   tests gated on a result_backend starting with 'redis': "
            f"{_counts_line(gated['counts'])}"
        )
    if "differs_from_plain" in doc:
        rows = doc["differs_from_plain"]
        skipped = doc.get("not_collected_here", 0)
        add(
            f"   differs from plain ({doc['baseline']}): {len(rows)} tests"
            + (f" (of plain's tests {skipped} not collected here)" if skipped else "")
        )
        for row in rows:
            message = row["message"] or row["teardown_message"]
            add(f"     {row['test']}: plain {row['plain']} -> {row[doc['mode']]}")
            if row.get("why"):
                add(f"       why: {row['why']}")
            if message:
                add(f"       {message[:200]}")
    repeated = doc["repeated_executions"]
    plain_repeated = doc.get("plain_repeated_executions")
    add(
        f"   task executions (task_prerun): {doc['task_executions']}"
        + (
            ""
            if "plain_task_executions" not in doc
            else f" (plain: {doc['plain_task_executions']})"
        )
    )
    add(
        "   task bodies started more than once for one task id, name and attempt: "
        f"{len(repeated)}"
        + ("" if plain_repeated is None else f" (plain: {plain_repeated})")
        + (f": {_dict_line(_by_task(repeated))}" if repeated else "")
    )
    if "executions_differing_from_plain" in doc:
        rows = doc["executions_differing_from_plain"]
        add(f"   (test, task) pairs whose executions differ in number from plain: {len(rows)}")
        for row in rows[:LIST_LIMIT]:
            add(f"     {row['test']}: {row['task']} plain {row['plain']} -> {row[doc['mode']]}")
    if doc["pikku_log"]:
        add(f"   pikku-celery warnings/errors: {_dict_line(doc['pikku_log'])}")
    mirror = doc.get("mirror")
    if mirror is not None:
        add(f"   mirror: runs {_dict_line(mirror['runs'])}")
        add(f"           steps {_dict_line(mirror['steps'])}")
        add(f"           attempts {_dict_line(mirror['attempts'])}")
        add(f"           attempt reasons {_dict_line(mirror['attempt_reasons'])}")
        add(f"   journal after exit: {_one_line(mirror['journal_after_exit'])}")
        add(
            f"   steps still open ({len(mirror['open_steps'])}): "
            f"{_dict_line(mirror['open_steps_by_task'])}"
        )
        for step in mirror["open_steps"][:LIST_LIMIT]:
            add(
                f"     {step['task']} {step['step_name']} {step['status']} "
                f"(attempt {step['attempt']}, run {step['run_status']}) in {step['test']}"
            )
        add(f"   runs still open, by workflow: {_dict_line(mirror['open_runs_by_workflow'])}")
        odd = mirror["failed_runs_without_failed_step"]
        add(f"   failed runs with no failed step: {len(odd)}")
        for run in odd[:LIST_LIMIT]:
            add(
                f"     {run['workflow']} {run['run_id']} steps {run['step_statuses']} "
                f"in {run['test']}: {run['error'][:160]}"
            )
        redelivered = mirror["attempts_delivered_more_than_once"]
        add(
            f"   attempts with delivery_count > 1: {len(redelivered)}"
            + (f": {_dict_line(_by_task(redelivered))}" if redelivered else "")
        )
        add(
            f"   of the repeated task bodies, mirrored as steps: "
            f"{mirror['repeated_executions_mirrored']}"
        )
        after = mirror["after_replay"]
        add(f"   journal replay: {_one_line(mirror['journal_replay'])}")
        add(
            f"   after the replay: steps {_dict_line(after['steps'])}; open "
            f"{_dict_line(after['open_steps_by_task'])}; failed runs with no failed step "
            f"{len(after['failed_runs_without_failed_step'])}"
        )
    return "\n".join(out)
