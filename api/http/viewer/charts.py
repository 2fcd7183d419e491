"""The fleet page's chart, laid out on the server: tool calls per second as bars, the share that
failed as a line, over the last minutes. The template draws it as SVG; no script is involved."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from api.http.recent_calls import RateBucket

WIDTH = 640
HEIGHT = 180
#: Room for the axes' labels: left, right, top, bottom.
LEFT, RIGHT, TOP, BOTTOM = 44, 44, 10, 24


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class RateChart:
    width: int
    height: int
    left: int
    right: int
    bars: list[Bar]
    #: The error rate as an SVG polyline's points ("x,y x,y ..."), empty with no calls at all.
    error_line: str
    rate_ticks: list[Tick]
    error_ticks: list[Tick]
    time_labels: list[tuple[float, str]]
    summary: str


def rate_chart(buckets: Sequence[RateBucket], now: float | None = None) -> RateChart:
    """Bars of calls per second and a line of the error rate, one per bucket, oldest first."""
    now = time.time() if now is None else now
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    base = TOP + plot_h
    peak = max((b.per_second for b in buckets), default=0.0)
    scale = _nice_ceiling(peak)
    slot = plot_w / max(len(buckets), 1)
    bars = []
    points = []
    for n, bucket in enumerate(buckets):
        height = plot_h * bucket.per_second / scale
        ago = now - bucket.start - bucket.width
        label = (
            f"{_ago(ago)}: {bucket.calls} calls ({bucket.per_second:.2f}/s), {bucket.errors} failed"
        )
        bars.append(Bar(LEFT + n * slot + 1, base - height, max(slot - 2, 1), height, label))
        if bucket.error_rate is not None:
            points.append(f"{LEFT + (n + 0.5) * slot:.1f},{base - plot_h * bucket.error_rate:.1f}")
    calls = sum(b.calls for b in buckets)
    errors = sum(b.errors for b in buckets)
    minutes = sum(b.width for b in buckets) / 60
    summary = (
        f"{calls} tool calls in the last {minutes:.0f} minutes, {errors} of them failed; "
        f"at most {peak:.2f} calls per second."
    )
    return RateChart(
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        right=RIGHT,
        bars=bars,
        error_line=" ".join(points),
        rate_ticks=[Tick(base - plot_h * f, f"{scale * f:g}/s") for f in (0, 0.5, 1)],
        error_ticks=[Tick(base - plot_h * f, f"{f:.0%}") for f in (0, 0.5, 1)],
        time_labels=[
            (LEFT, f"-{minutes:.0f} min"),
            (LEFT + plot_w / 2, f"-{minutes / 2:.0f} min"),
            (LEFT + plot_w, "now"),
        ],
        summary=summary,
    )


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at or above ``value`` (1 for nothing)."""
    step = 1.0
    while True:
        for factor in (1, 2, 5):
            if value <= step * factor:
                return step * factor
        step *= 10


def _ago(seconds: float) -> str:
    seconds = max(seconds, 0)
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.1f} min ago"
