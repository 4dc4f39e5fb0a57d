"""The timeline SVG: one row per attempt, bars where the times say, text escaped."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

from pikku_celery import StepAttempt
from pikku_celery.dashboard.timeline import STATUS_COLORS, render_timeline

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
SVG = "{http://www.w3.org/2000/svg}"


def attempt(number: int, status: str, **times: Any) -> StepAttempt:
    base: dict[str, Any] = {
        "scheduled_at": None,
        "running_at": None,
        "succeeded_at": None,
        "failed_at": None,
    }
    base.update(times)
    return StepAttempt(
        history_id=f"h{number}",
        step_id="s",
        step_name="charge<script>",
        from_step_name=None,
        attempt=number,
        status=status,
        result=None,
        error={"type": "E", "message": "<b>boom</b> & more"} if status == "failed" else None,
        retries=2,
        retry_delay=None,
        created_at=base["scheduled_at"] or T0,
        **base,
    )


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_one_row_per_attempt_colored_by_outcome() -> None:
    attempts = [
        attempt(1, "failed", scheduled_at=at(0), running_at=at(1), failed_at=at(2)),
        attempt(2, "failed", scheduled_at=at(2), running_at=at(3), failed_at=at(4), eta=at(3)),
        attempt(3, "succeeded", scheduled_at=at(4), running_at=at(5), succeeded_at=at(10)),
    ]
    svg = render_timeline(attempts, now=at(60))
    assert svg is not None
    root = ET.fromstring(str(svg))  # well-formed: everything is escaped
    rows = root.findall(f"{SVG}g[@class='attempt']")
    assert [(r.get("data-attempt"), r.get("data-status")) for r in rows] == [
        ("1", "failed"),
        ("2", "failed"),
        ("3", "succeeded"),
    ]
    runs = [
        rect for row in rows for rect in row.findall(f"{SVG}rect") if "run" in rect.get("class", "")
    ]
    assert [rect.get("fill") for rect in runs] == [
        STATUS_COLORS["failed"],
        STATUS_COLORS["failed"],
        STATUS_COLORS["succeeded"],
    ]
    # The run ends at 10 s: the last bar reaches the chart's right edge, the first starts left.
    xs = [float(rect.get("x", "0")) for rect in runs]
    widths = [float(rect.get("width", "0")) for rect in runs]
    assert xs == sorted(xs)
    assert abs(xs[2] + widths[2] - (200 + 620)) < 0.2
    assert len(rows[1].findall(f"{SVG}line[@class='eta']")) == 1
    title = rows[0].find(f"{SVG}title")
    assert title is not None and "<b>boom</b> & more" in (title.text or "")
    assert "<script>" not in str(svg)


def test_a_running_attempt_reaches_now() -> None:
    svg = render_timeline(
        [
            attempt(1, "succeeded", scheduled_at=at(0), running_at=at(0), succeeded_at=at(1)),
            attempt(2, "running", scheduled_at=at(1), running_at=at(2)),
        ],
        now=at(4),
    )
    root = ET.fromstring(str(svg))
    running = root.find(f"{SVG}g[@data-status='running']/{SVG}rect[@fill='#2f7bd6']")
    assert running is not None
    assert abs(float(running.get("x", "0")) + float(running.get("width", "0")) - 820) < 0.2


def test_nothing_to_draw() -> None:
    assert render_timeline([], now=T0) is None


def test_a_lost_attempt_ends_when_it_was_found_lost_not_now() -> None:
    lost = replace(
        attempt(1, "lost", scheduled_at=at(0), running_at=at(1)),
        error={"type": "pikku_celery.WorkerLost", "message": "gone", "lost_at": at(5).isoformat()},
    )
    retried = attempt(2, "succeeded", scheduled_at=at(5), running_at=at(6), succeeded_at=at(10))
    svg = render_timeline([lost, retried], now=at(600))
    root = ET.fromstring(str(svg))
    bar = root.find(f"{SVG}g[@data-status='lost']/{SVG}rect[@class='run status-lost']")
    assert bar is not None and bar.get("fill") == STATUS_COLORS["lost"]
    # The chart spans 0..10 s, not to "now": the lost bar stops at 5 s, halfway.
    assert abs(float(bar.get("x", "0")) + float(bar.get("width", "0")) - (200 + 310)) < 0.2
    title = root.find(f"{SVG}g[@data-status='lost']/{SVG}title")
    assert title is not None and "lost 12:00:05.000" in (title.text or "")


def test_a_lost_attempt_without_a_readable_time_is_drawn_to_now() -> None:
    lost = replace(
        attempt(1, "lost", scheduled_at=at(0), running_at=at(1)),
        error={"type": "pikku_celery.WorkerLost", "message": "gone", "lost_at": "yesterday"},
    )
    root = ET.fromstring(str(render_timeline([lost], now=at(10))))
    bar = root.find(f"{SVG}g[@data-status='lost']/{SVG}rect[@class='run status-lost']")
    assert bar is not None
    assert abs(float(bar.get("x", "0")) + float(bar.get("width", "0")) - 820) < 0.2


def test_a_lost_time_before_the_start_leaves_a_mark_where_it_started() -> None:
    # The reaper's clock may be behind the worker's.
    lost = replace(
        attempt(1, "lost", scheduled_at=at(0), running_at=at(4)),
        error={"type": "pikku_celery.WorkerLost", "message": "gone", "lost_at": at(2).isoformat()},
    )
    root = ET.fromstring(str(render_timeline([lost], now=at(60))))
    bar = root.find(f"{SVG}g[@data-status='lost']/{SVG}rect[@class='run status-lost']")
    assert bar is not None
    assert abs(float(bar.get("x", "0")) - 820) < 0.2 and float(bar.get("width", "0")) == 3.0


def test_a_redelivered_attempt_is_marked_where_its_last_delivery_began() -> None:
    redelivered = replace(
        attempt(1, "succeeded", scheduled_at=at(0), running_at=at(6), succeeded_at=at(16)),
        delivery_count=2,
    )
    once = replace(
        attempt(2, "succeeded", scheduled_at=at(0), running_at=at(1), succeeded_at=at(11)),
        delivery_count=1,
    )
    root = ET.fromstring(str(render_timeline([redelivered, once], now=at(60))))
    first, second = root.findall(f"{SVG}g[@class='attempt']")
    [mark] = first.findall(f"{SVG}line[@class='redelivery']")
    [run] = first.findall(f"{SVG}rect[@class='run status-succeeded']")
    assert mark.get("x1") == run.get("x")  # at the start of the run that ended it
    tooltip = first.findtext(f"{SVG}title") or ""
    assert "delivered 2 times" in tooltip and "took 10.0s" in tooltip
    assert second.findall(f"{SVG}line[@class='redelivery']") == []
    assert "redelivered" not in (second.findtext(f"{SVG}title") or "")
