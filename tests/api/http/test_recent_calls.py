"""The calls of the last minutes: rates per bucket, errors, latency by tool, and the window."""

from __future__ import annotations

import pytest

from api.http.recent_calls import RecentCalls, quantile
from api.http.viewer.charts import rate_chart
from tests.conftest import Clock


def test_calls_are_counted_per_bucket_and_old_ones_leave_the_window() -> None:
    clock = Clock()
    recent = RecentCalls(window_s=60, clock=clock)
    recent.add("old", True, 0.1)
    clock.now += 61
    for n in range(10):
        recent.add("read_file", n != 0, 0.001 * (n + 1))
    recent.add("run_bash", False, 2.0)
    buckets = recent.rates(bucket_s=10)
    assert len(buckets) == 6
    assert [b.calls for b in buckets] == [0, 0, 0, 0, 0, 11]
    assert buckets[-1].errors == 2 and buckets[-1].per_second == pytest.approx(1.1)
    assert buckets[0].error_rate is None
    latency = {row.tool: row for row in recent.latency_by_tool()}
    assert set(latency) == {"read_file", "run_bash"}
    assert latency["read_file"].calls == 10 and latency["read_file"].errors == 1
    assert latency["read_file"].p50_ms == pytest.approx(5.5)
    assert latency["read_file"].p95_ms == pytest.approx(9.55)


def test_memory_is_bounded_whatever_the_rate() -> None:
    recent = RecentCalls(max_calls=5, clock=Clock())
    for _ in range(20):
        recent.add("noop", True, 0.0)
    assert len(recent.samples()) == 5


def test_quantiles_interpolate_between_ranks() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([7.0], 0.95) == 7.0
    with pytest.raises(ValueError, match="no values"):
        quantile([], 0.5)


def test_the_chart_scales_to_the_busiest_bucket_and_draws_the_error_rate() -> None:
    clock = Clock()
    recent = RecentCalls(window_s=60, clock=clock)
    for n in range(30):
        recent.add("t", n % 3 != 0, 0.01)
    chart = rate_chart(recent.rates(bucket_s=10), now=clock.now)
    assert [tick.label for tick in chart.rate_ticks] == ["0/s", "2.5/s", "5/s"]
    assert chart.bars[-1].height > 0 and all(bar.height == 0 for bar in chart.bars[:-1])
    assert chart.error_line.count(",") == 1  # one bucket had calls: one point
    assert chart.summary.startswith("30 tool calls in the last 1 minutes, 10 of them failed")


def test_refused_calls_are_counted_apart_from_the_calls_that_ran() -> None:
    recent = RecentCalls(window_s=60, clock=Clock())
    recent.add("run_bash", True, 2.0)
    recent.add("run_bash", False, 0.0, refused=True)
    recent.add("made_up", False, 0.0, refused=True)

    latency = {row.tool: row for row in recent.latency_by_tool()}

    assert (latency["run_bash"].calls, latency["run_bash"].errors) == (1, 0)
    assert latency["run_bash"].p50_ms == pytest.approx(2000.0)
    assert latency["run_bash"].refused == 1
    made_up = latency["made_up"]
    assert (made_up.calls, made_up.p50_ms, made_up.p95_ms, made_up.refused) == (0, None, None, 1)
    assert sum(bucket.calls for bucket in recent.rates(bucket_s=10)) == 1
