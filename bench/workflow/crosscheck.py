"""The processes' transaction counts against what ``pg_stat_database`` saw.

Over the whole timed phase, then over a few more untimed runs of each mirrored
kind with the server's count settled between them, so a kind's figure is its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from bench.harness.postgres import BenchDatabases
from bench.workflow.runs import DATABASE, Bench
from bench.workflow.sql_counts import Counts
from bench.workflow.summary import ServerCheck, pikku_transactions

# Runs of each kind for the per-kind pg_stat_database cross-check (not timed).
CHECK_RUNS: Final = 3
# Who sent SQL to the bench database: the worker's children, and this process
# publishing and polling ("other" is this process's other SQL, e.g. the admin
# connection to another database).
SECTIONS: Final = ("worker", "publish", "poll")


@dataclass(frozen=True)
class CrossCheck:
    """The timed phase's transactions on the server and as counted, then each kind's."""

    server: int
    counted: int
    kinds: dict[str, ServerCheck]


def cross_check(
    bench: Bench, database: BenchDatabases, before: Counts, baseline: int, wait: float
) -> CrossCheck:
    """Read right after the timed phase that started at ``before`` and ``baseline``."""
    # The whole timed phase: what the server saw against what we counted.
    server = database.transactions(DATABASE, wait=wait)
    # Not "other": that is the admin connection, to another database.
    delta = bench.counts().minus(before).transactions
    total_server, counted = server - baseline, sum(delta[s] for s in SECTIONS)
    baseline = server
    kinds: dict[str, ServerCheck] = {}
    for kind in ("workflow", "chain"):
        extra = bench.batch(kind, 1)
        for _ in range(CHECK_RUNS - 1):
            extra.add(bench.batch(kind, 1))
        server = database.transactions(DATABASE, wait=wait)
        kinds[kind] = ServerCheck(
            runs=CHECK_RUNS,
            server=server - baseline,
            pikku=pikku_transactions(extra.counts),
            polling=extra.counts.transactions["poll"],
        )
        baseline = server
    return CrossCheck(total_server, counted, kinds)
