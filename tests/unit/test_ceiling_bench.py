"""The ceiling bench's arithmetic: which processes are the server's, and per-task figures."""

from __future__ import annotations

import pytest

from bench.ceiling.figures import SECONDS_A_DAY, figures
from bench.ceiling.server import Process, Reading, server_ticks


def test_the_servers_ticks_are_the_postmasters_its_childrens_and_the_reaped_ones() -> None:
    every = [
        Process(pid=100, parent=1, own=50, reaped=700),  # the postmaster
        Process(pid=101, parent=100, own=30, reaped=0),  # WAL writer
        Process(pid=102, parent=100, own=20, reaped=0),  # a backend
        Process(pid=200, parent=1, own=999, reaped=999),  # another server's postmaster
        Process(pid=201, parent=200, own=999, reaped=0),  # its backend
        Process(pid=300, parent=102, own=999, reaped=0),  # not forked by the postmaster
    ]
    assert server_ticks(every, postmaster=100) == 50 + 700 + 30 + 20


def _reading(cpu: float, reader: float, wal: int, xid: int, notifies: int, **sizes: int) -> Reading:
    return Reading(cpu, reader, wal, xid, notifies, dict(sizes))


def test_per_task_figures_leave_out_the_benchs_own_reading_connection() -> None:
    before = _reading(10.0, 1.0, 1_000, 500, 3, steps=8192, runs=8192)
    after = _reading(
        10.9, 1.1, 1_001_000, 700, 103, steps=8192 + 1_000_000, runs=8192, results=400_000
    )
    measured = figures(before, after, tasks=1000, seconds=4.0)
    assert measured.cpu_ms == pytest.approx(0.8)  # (0.9 - 0.1) s over 1000 tasks
    assert measured.per_core == pytest.approx(1250)
    assert measured.cores(16) == pytest.approx(20_000)
    assert measured.commits == pytest.approx(0.2)
    assert measured.wal_bytes == pytest.approx(1000)
    assert measured.notifies == pytest.approx(0.1)
    assert measured.rate == pytest.approx(250)
    # A table that did not grow is left out; one made meanwhile counts from nothing.
    assert measured.table_bytes == {"steps": 1000, "results": 400}
    assert measured.kept_bytes == 1400
    assert measured.kept_a_day(1000) == pytest.approx(1400 * 1000 * SECONDS_A_DAY)


def test_no_figures_of_an_interval_without_tasks() -> None:
    reading = _reading(1.0, 0.0, 0, 0, 0)
    with pytest.raises(ValueError, match="0 tasks"):
        figures(reading, reading, tasks=0, seconds=1.0)
