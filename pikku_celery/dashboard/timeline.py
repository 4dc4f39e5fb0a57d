"""The timeline picture of a run's attempts: inline SVG drawn on the server.

One row per attempt. A thin bar spans the wait from being scheduled to
starting, a thick bar the run from starting to its outcome (to now while it
still runs; to when the reaper found it gone for a lost one), colored by
status. A redelivered attempt starts at its last delivery, marked by a line: the
wait before it holds the deliveries cut short. Every text is escaped here, since
the SVG is put into the page as markup.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from html import escape
from typing import Final

from markupsafe import Markup

from pikku_celery.store import StepAttempt

__all__ = ["STATUS_COLORS", "lost_at", "render_timeline"]

STATUS_COLORS: Final = {
    "succeeded": "#2e9e5b",
    "failed": "#d64545",
    "cancelled": "#7a7a7a",
    "running": "#2f7bd6",
    "lost": "#8e44ad",
    "scheduled": "#c9a227",
    "pending": "#b0b0b0",
}
_WAIT_COLOR: Final = "#c8cdd3"
_LABEL_WIDTH: Final = 200
_CHART_WIDTH: Final = 620
_ROW_HEIGHT: Final = 26
_TOP: Final = 28
_RIGHT_PAD: Final = 50
_MIN_BAR: Final = 3.0
_SETTLED: Final = frozenset({"succeeded", "failed", "cancelled"})


def _seconds(delta: dt.timedelta) -> str:
    value = delta.total_seconds()
    return f"{value:.3f}s" if value < 10 else f"{value:.1f}s"


def _clock(value: dt.datetime | None) -> str:
    return "—" if value is None else value.strftime("%H:%M:%S.%f")[:-3]


def _start(attempt: StepAttempt) -> dt.datetime:
    # Events come out of order: a retry can start before its "scheduled" is recorded.
    known = [t for t in (attempt.scheduled_at, attempt.running_at) if t is not None]
    return min(known) if known else attempt.created_at


def lost_at(attempt: StepAttempt) -> dt.datetime | None:
    """When the reaper found a lost attempt's worker gone, from the error it stored."""
    if attempt.status != "lost" or not attempt.error:
        return None
    raw = attempt.error.get("lost_at")
    if not isinstance(raw, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(raw)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def _end(attempt: StepAttempt, now: dt.datetime) -> dt.datetime:
    gone = lost_at(attempt)
    if gone is not None:
        # Nothing ran it after that (its end time, once given up, is when the reaper gave
        # up on it), so the bar must not grow with the clock; the reaper's clock may be
        # behind the worker's, hence the floor.
        return max(gone, attempt.running_at or _start(attempt))
    if attempt.ended_at is not None:
        return attempt.ended_at
    if attempt.status in _SETTLED:
        # An outcome without its time (an older writer): the last time known.
        return attempt.running_at or _start(attempt)
    return max(now, _start(attempt))


def _tooltip(attempt: StepAttempt, now: dt.datetime) -> str:
    lines = [
        f"{attempt.step_name} #{attempt.attempt}: {attempt.status}",
        f"scheduled {_clock(attempt.scheduled_at)}",
    ]
    if attempt.eta is not None:
        lines.append(f"eta {_clock(attempt.eta)}")
    if attempt.delivery_count > 1:
        # The start is the last delivery's: the ones before it ran on a worker that died.
        lines.append(
            f"redelivered: delivered {attempt.delivery_count} times, the earlier deliveries "
            "cut short (their worker died); times below are the last delivery's"
        )
    lines.append(f"running {_clock(attempt.running_at)}")
    gone = lost_at(attempt)
    if gone is not None:
        lines.append(f"lost {_clock(gone)}")
    else:
        lines.append(f"ended {_clock(attempt.ended_at)}")
    if attempt.running_at is not None:
        lines.append(f"took {_seconds(_end(attempt, now) - attempt.running_at)}")
    if attempt.worker:
        lines.append(f"worker {attempt.worker} pid {attempt.pid}")
    if attempt.error:
        kind = attempt.error.get("type") or attempt.error.get("code") or "Error"
        lines.append(f"{kind}: {attempt.error.get('message')}")
    return "\n".join(lines)


def render_timeline(attempts: Sequence[StepAttempt], now: dt.datetime) -> Markup | None:
    """The attempts as an SVG, or None when there is none to draw."""
    if not attempts:
        return None
    t0 = min(_start(a) for a in attempts)
    t1 = max(_end(a, now) for a in attempts)
    span = max((t1 - t0).total_seconds(), 0.001)

    def x(moment: dt.datetime) -> float:
        return _LABEL_WIDTH + (moment - t0).total_seconds() / span * _CHART_WIDTH

    width = _LABEL_WIDTH + _CHART_WIDTH + _RIGHT_PAD
    height = _TOP + len(attempts) * _ROW_HEIGHT + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" font-size="12">',
        "<title>Attempts over time</title>",
    ]
    out.extend(_axis(span, height))
    for row, attempt in enumerate(attempts):
        out.extend(_row(attempt, row, x, now))
    out.extend(_legend(height))
    out.append("</svg>")
    return Markup("".join(out))


def _axis(span: float, height: int) -> list[str]:
    parts = []
    for i in range(5):
        at = _LABEL_WIDTH + i * _CHART_WIDTH / 4
        label = _seconds(dt.timedelta(seconds=span * i / 4))
        parts.append(
            f'<line class="tick" x1="{at:.1f}" y1="{_TOP - 6}" x2="{at:.1f}" '
            f'y2="{height - 26}" stroke="#e3e6ea"/>'
            f'<text x="{at:.1f}" y="{_TOP - 10}" text-anchor="middle" fill="#555">'
            f"+{label}</text>"
        )
    return parts


def _row(
    attempt: StepAttempt, row: int, x: Callable[[dt.datetime], float], now: dt.datetime
) -> list[str]:
    y = _TOP + row * _ROW_HEIGHT
    mid = y + _ROW_HEIGHT / 2
    color = STATUS_COLORS.get(attempt.status, "#999999")
    label = f"{attempt.step_name} #{attempt.attempt}"
    parts = [
        f'<g class="attempt" data-step="{escape(attempt.step_name)}" '
        f'data-attempt="{attempt.attempt}" data-status="{escape(attempt.status)}">',
        f"<title>{escape(_tooltip(attempt, now))}</title>",
        f'<text class="label" x="{_LABEL_WIDTH - 8}" y="{mid + 4:.1f}" text-anchor="end" '
        f'fill="#222">{escape(_truncate(label))}</text>',
    ]
    start = _start(attempt)
    wait_end = attempt.running_at or _end(attempt, now)
    if wait_end > start:
        x0, x1 = x(start), x(wait_end)
        parts.append(
            f'<rect class="wait" x="{x0:.1f}" y="{mid - 2:.1f}" width="{max(x1 - x0, 1.0):.1f}" '
            f'height="4" fill="{_WAIT_COLOR}"/>'
        )
    if attempt.eta is not None and attempt.eta > start:
        at = x(min(attempt.eta, _end(attempt, now)))
        parts.append(
            f'<line class="eta" x1="{at:.1f}" y1="{mid - 7:.1f}" x2="{at:.1f}" '
            f'y2="{mid + 7:.1f}" stroke="#888" stroke-dasharray="2,2"/>'
        )
    if attempt.running_at is not None and attempt.delivery_count > 1:
        # Where the redelivery began: the wait before it holds the killed executions.
        at = x(attempt.running_at)
        parts.append(
            f'<line class="redelivery" x1="{at:.1f}" y1="{mid - 10:.1f}" x2="{at:.1f}" '
            f'y2="{mid + 10:.1f}" stroke="{STATUS_COLORS["lost"]}" stroke-width="2"/>'
        )
    if attempt.running_at is not None:
        r0, r1 = x(attempt.running_at), x(_end(attempt, now))
        parts.append(
            f'<rect class="run status-{escape(attempt.status)}" x="{r0:.1f}" '
            f'y="{mid - 7:.1f}" width="{max(r1 - r0, _MIN_BAR):.1f}" height="14" rx="2" '
            f'fill="{color}"/>'
        )
    elif attempt.status in _SETTLED:
        # Settled without ever running (revoked while waiting): a mark where it ended.
        at = x(_end(attempt, now))
        parts.append(
            f'<rect class="run status-{escape(attempt.status)}" x="{at - 2:.1f}" '
            f'y="{mid - 7:.1f}" width="4" height="14" fill="{color}"/>'
        )
    parts.append("</g>")
    return parts


def _truncate(text: str, width: int = 28) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _legend(height: int) -> list[str]:
    parts = ['<g class="legend">']
    at = float(_LABEL_WIDTH)
    entries = [("waiting", _WAIT_COLOR), *STATUS_COLORS.items()]
    for name, color in entries:
        parts.append(
            f'<rect x="{at:.1f}" y="{height - 16}" width="10" height="10" fill="{color}"/>'
            f'<text x="{at + 14:.1f}" y="{height - 7}" fill="#555">{name}</text>'
        )
        at += 14 + 8 * len(name) + 12
    parts.append("</g>")
    return parts
