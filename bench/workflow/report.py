"""The workflow bench's tables: per-step figures by kind, SQL by method, CPU, the
timeline of a step, and the cross-check against ``pg_stat_database``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from bench.harness.report import say
from bench.workflow.crosscheck import CrossCheck
from bench.workflow.summary import KindSummary
from bench.workflow.timeline import TIMELINE_PARTS, Timeline

TARGET: Final = 2.0
# The CPU table's rows: the worker, the bench database's server side, this process.
CPU_PARTS: Final = ("worker children", "worker main", "postgres", "this process")


def _cell(value: float | None, width: int, digits: int = 2) -> str:
    if value is None or value != value:  # missing, or NaN
        return f"{'-':>{width}}"
    return f"{value:{width}.{digits}f}"


# The sides whose SQL is pikku's: the worker's children, and this process publishing.
PIKKU_SIDES: Final = ("worker", "publish")


def report(
    summaries: dict[str, KindSummary], timelines: dict[str, Timeline], concurrent: int
) -> bool:
    """Every table but the cross-check; whether the target was met."""
    workflow, chain_ = summaries["workflow"], summaries["chain"]
    floor = summaries.get("celery")
    shown = [workflow, chain_] + ([floor] if floor else [])
    ok = report_kinds(workflow, chain_, floor, concurrent)
    report_sql(workflow, chain_)
    report_cost(shown)
    report_tasks(shown)
    report_timeline(timelines)
    return ok


def report_kinds(
    workflow: KindSummary, chain_: KindSummary, floor: KindSummary | None, concurrent: int
) -> bool:
    """The per-step figures of each kind, the workflow/chain ratios and the target."""
    say()
    say(
        f"{workflow.steps} steps per run, {len(workflow.runs)} runs of each kind, "
        f"{concurrent} run(s) in flight at a time"
    )
    say()
    header = (
        f"{'kind':<9} {'steps':>5} {'runs':>4} {'ms/step med':>11} {'ms/step p90':>11} "
        f"{'stmts/step':>10} {'xacts/step':>10} {'pg xacts/step':>13} {'tasks/step':>10}"
    )
    say(header)
    say("-" * len(header))

    def row(summary: KindSummary) -> None:
        server = summary.server_per_step
        say(
            f"{summary.kind:<9} {summary.steps:>5} {len(summary.runs):>4} "
            f"{_cell(summary.median, 11)} {_cell(summary.p90, 11)} "
            f"{_cell(summary.per_step(summary.statements), 10)} "
            f"{_cell(summary.per_step(summary.transactions), 10)} {_cell(server, 13)} "
            f"{_cell(summary.per_step(summary.tasks), 10)}"
        )

    row(workflow)
    row(chain_)
    wall = workflow.median / chain_.median
    wall_p90 = workflow.p90 / chain_.p90
    stmts = workflow.per_step(workflow.statements) / chain_.per_step(chain_.statements)
    xacts = workflow.per_step(workflow.transactions) / chain_.per_step(chain_.transactions)
    say(f"{'ratio':<9} {'':>5} {'':>4} {wall:11.2f} {wall_p90:11.2f} {stmts:10.2f} {xacts:10.2f}")
    if floor is not None:
        say("-" * len(header))
        row(floor)
        say(
            "(celery: the same chain of plain Celery tasks, not mirrored, on the same "
            "worker: what Celery alone costs)"
        )
    say()
    wall_ok, stmts_ok = wall <= TARGET, stmts <= TARGET
    say(
        f"Target, workflow/chain <= {TARGET:g} per step: wall time (median) {wall:.2f} "
        f"{'met' if wall_ok else 'NOT met'}; SQL statements {stmts:.2f} "
        f"{'met' if stmts_ok else 'NOT met'}."
    )
    say(
        "(xacts: transactions counted by the processes; pg xacts: pg_stat_database's "
        "count for the bench database over separate untimed runs, less the bench's polling)"
    )
    return wall_ok and stmts_ok


def _pikku_labels(counted: Iterable[str]) -> set[str]:
    return {key for key in counted if key.split(":", 1)[0] in PIKKU_SIDES}


def report_sql(workflow: KindSummary, chain_: KindSummary) -> None:
    """Statements, then SQL wait, per step by side and the method that sent them."""
    pair = (workflow, chain_)
    say()
    say("Statements per step, by side and the WorkflowStore method that sent them:")
    labels = sorted(_pikku_labels(key for s in pair for key in s.counts.statements))
    say(f"  {'side:method':<40} {'workflow':>9} {'chain':>9}")
    for label in labels:
        cells = [_cell(s.per_step(s.counts.statements[label]), 9) for s in pair]
        say(f"  {label:<40} {cells[0]} {cells[1]}")

    say()
    say("SQL wait per step, ms, by side and what sent it (statements, then commits):")
    timed = sorted(
        _pikku_labels(key for s in pair for key in s.counts.sql_ms),
        key=lambda key: ("COMMIT" in key, key),
    )
    say(f"  {'side:method':<40} {'workflow':>9} {'chain':>9}")
    for label in timed:
        cells = [_cell(s.per_step(s.counts.sql_ms.get(label, 0.0)), 9) for s in pair]
        say(f"  {label:<40} {cells[0]} {cells[1]}")


def report_cost(shown: Sequence[KindSummary]) -> None:
    """Per step: the SQL wait of each pikku side and the CPU of each process."""
    say()
    say("Per step, ms: waiting on SQL (execute + commit) and CPU by process:")
    names = [s.kind for s in shown]
    say(f"  {'':<40} " + " ".join(f"{name:>9}" for name in names))
    for side in PIKKU_SIDES:
        cells = [_cell(s.per_step(s.counts.sql_ms_in(side)), 9) for s in shown]
        say(f"  {'SQL wait, ' + side:<40} " + " ".join(cells))
    for part in CPU_PARTS:
        cells = [_cell(s.per_step(s.cpu[part] * 1000) if part in s.cpu else None, 9) for s in shown]
        say(f"  {'CPU, ' + part:<40} " + " ".join(cells))


def report_tasks(shown: Sequence[KindSummary]) -> None:
    say()
    say("Tasks run by the worker:")
    for summary in shown:
        tasks = ", ".join(f"{name} {n}" for name, n in sorted(summary.counts.tasks.items()))
        say(f"  {summary.kind:<9} {summary.tally.tasks_expected} expected; {tasks}")


def report_timeline(timelines: dict[str, Timeline]) -> None:
    say()
    say("Mean ms per step from the attempts' timestamps (steps 2..n):")
    say(f"  {'part':<40} {'workflow':>9} {'chain':>9}")
    for name in TIMELINE_PARTS:
        cells = [_cell(timelines[kind].mean(name), 9) for kind in ("workflow", "chain")]
        say(f"  {name:<40} {cells[0]} {cells[1]}")


def report_cross_check(check: CrossCheck) -> None:
    say()
    say("Cross-check, transactions the server saw for the bench database:")
    say(
        f"  timed phase, all kinds: pg_stat_database {check.server}, counted by the "
        f"processes {check.counted} (pikku and the bench's polling)"
    )
    for kind, result in check.kinds.items():
        say(
            f"  {result.runs} more {kind} runs: pg_stat_database {result.server}, "
            f"counted {result.pikku + result.polling} "
            f"({result.pikku} pikku + {result.polling} polling)"
        )
    say(
        "  (a few more on the server than counted: psycopg prepares a statement on "
        "its 6th use on a connection,\n   a Parse + Sync round trip that is a "
        "transaction of its own and that no SQLAlchemy event sees)"
    )
