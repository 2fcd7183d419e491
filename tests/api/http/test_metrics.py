"""Prometheus metrics: what a scrape shows after tool calls, runs and queue readings."""

from __future__ import annotations

from collections.abc import Mapping

import fakeredis
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.conversation.events import (
    AgentEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from api.http.app import create_app
from api.http.metrics import ApiMetrics, RunObserver
from api.settings import OrchestratorSettings
from tests.api.http.conftest import AUTH, StubExecutor, api_settings


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in exposition text, or None when it is not there."""
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    return None


def scrape(metrics: ApiMetrics) -> str:
    return metrics.render().decode()


def started(call_id: str, name: str) -> ToolCallStarted:
    return ToolCallStarted(call_id, name, "{}")


def finished(
    call_id: str, name: str, *, error_kind: str | None = None, ms: float = 20.0
) -> ToolCallFinished:
    return ToolCallFinished(call_id, name, "out", error_kind is not None, error_kind, ms, "w@h")


def test_tool_calls_are_counted_by_tool_and_outcome_with_their_latency() -> None:
    metrics = ApiMetrics(tools=["read_file", "run_bash"])
    events: list[AgentEvent] = [
        started("a", "read_file"),
        started("b", "read_file"),
        started("c", "run_bash"),
        TextDelta("ignored"),
        finished("a", "read_file", ms=4),
        finished("b", "read_file", error_kind="invalid_arguments", ms=1),
    ]
    for event in events:
        metrics.record_event(event)
    text = scrape(metrics)
    assert sample(text, "toolq_tool_calls_total", tool="read_file", outcome="ok") == 1
    assert (
        sample(text, "toolq_tool_calls_total", tool="read_file", outcome="invalid_arguments") == 1
    )
    assert sample(text, "toolq_tool_calls_total", tool="run_bash", outcome="ok") is None
    assert sample(text, "toolq_tool_call_seconds_count", tool="read_file") == 2
    assert sample(text, "toolq_tool_call_seconds_sum", tool="read_file") == pytest.approx(0.005)
    assert sample(text, "toolq_tool_call_seconds_bucket", tool="read_file", le="0.005") == 2
    assert sample(text, "toolq_tool_calls_in_flight") == 1  # run_bash has not answered


def test_a_run_cut_short_gives_back_the_calls_it_left_in_flight() -> None:
    metrics = ApiMetrics()
    first, second = RunObserver(metrics), RunObserver(metrics)
    first(started("x", "slow_read"))
    first(started("y", "noop"))
    first(finished("y", "noop"))
    second(started("x", "slow_read"))
    assert sample(scrape(metrics), "toolq_tool_calls_in_flight") == 2
    first.close()  # cancelled while slow_read ran
    assert sample(scrape(metrics), "toolq_tool_calls_in_flight") == 1
    second(finished("x", "slow_read"))
    second.close()
    assert sample(scrape(metrics), "toolq_tool_calls_in_flight") == 0


def test_transcript_calls_count_like_live_ones() -> None:
    metrics = ApiMetrics(tools=["write_file"])
    metrics.record_tool_calls(
        [
            {"name": "write_file", "is_error": False, "error_kind": None, "duration_ms": 30},
            {"name": "write_file", "is_error": True, "error_kind": "timeout", "duration_ms": 900},
        ]
    )
    text = scrape(metrics)
    assert sample(text, "toolq_tool_calls_total", tool="write_file", outcome="ok") == 1
    assert sample(text, "toolq_tool_calls_total", tool="write_file", outcome="timeout") == 1
    assert sample(text, "toolq_tool_call_seconds_sum", tool="write_file") == pytest.approx(0.93)


USAGE = {
    "cpu_ms": 1500,
    "max_rss_kb": 2048,
    "pids_peak": 3,
    "killed_processes": 2,
    "oom_killed": True,
}


def test_what_commands_used_is_observed_per_pool_and_unknown_figures_are_left_out() -> None:
    metrics = ApiMetrics()
    partial = {**USAGE, "pids_peak": None, "killed_processes": None, "oom_killed": False}
    metrics.record_event(
        ToolCallFinished("a", "run_bash", "{}", False, None, 9.0, "w@h", "sandbox", USAGE)
    )
    metrics.record_tool_calls(
        [
            {"name": "run_bash", "duration_ms": 5, "pool": "sandbox", "usage": partial},
            {"name": "read_file", "duration_ms": 1, "pool": "tools", "usage": None},
        ]
    )

    text = scrape(metrics)

    assert sample(text, "toolq_command_cpu_seconds_count", pool="sandbox") == 2
    assert sample(text, "toolq_command_cpu_seconds_sum", pool="sandbox") == pytest.approx(3.0)
    assert sample(text, "toolq_command_memory_peak_bytes_sum", pool="sandbox") == 2 * 2048 * 1024
    assert sample(text, "toolq_command_processes_peak_count", pool="sandbox") == 1
    assert sample(text, "toolq_command_killed_processes_sum", pool="sandbox") == 2
    assert sample(text, "toolq_command_oom_kills_total", pool="sandbox") == 1
    assert sample(text, "toolq_command_cpu_seconds_count", pool="tools") is None


def test_invented_tool_names_count_as_one_unknown_series() -> None:
    metrics = ApiMetrics(tools=["read_file"])
    for n in range(50):
        metrics.record_event(started(f"c{n}", f"invented_{n}"))
        metrics.record_event(finished(f"c{n}", f"invented_{n}", error_kind="unknown_tool"))
    metrics.record_tool_calls(
        [{"name": "made_up", "is_error": True, "error_kind": "unknown_tool", "duration_ms": 0}]
    )
    metrics.record_event(finished("r", "read_file"))

    calls = tool_labels(scrape(metrics), "toolq_tool_calls_total")
    assert calls == {("unknown", "unknown_tool"): 51, ("read_file", "ok"): 1}
    # A refused call ran no tool: it has no latency to count.
    assert tool_labels(scrape(metrics), "toolq_tool_call_seconds_count") == {
        ("read_file", ""): 1,
    }


def test_a_tool_the_fleet_serves_later_gets_its_own_series_from_then_on() -> None:
    metrics = ApiMetrics()
    metrics.record_event(finished("a", "new_tool"))
    metrics.know_tools(["new_tool"])
    metrics.record_event(finished("b", "new_tool"))

    assert tool_labels(scrape(metrics), "toolq_tool_calls_total") == {
        ("unknown", "ok"): 1,
        ("new_tool", "ok"): 1,
    }


def tool_labels(text: str, name: str) -> dict[tuple[str, str], float]:
    """Every sample of ``name``: (tool, outcome) -> value."""
    return {
        (found.labels["tool"], found.labels.get("outcome", "")): float(found.value)
        for family in text_string_to_metric_families(text)
        for found in family.samples
        if found.name == name
    }


def test_runs_are_counted_by_final_status() -> None:
    metrics = ApiMetrics()
    for status in ["succeeded", "succeeded", "cancelled"]:
        metrics.record_run(status)
    text = scrape(metrics)
    assert sample(text, "toolq_runs_total", status="succeeded") == 2
    assert sample(text, "toolq_runs_total", status="cancelled") == 1


def test_each_app_has_its_own_series() -> None:
    one, other = ApiMetrics(tools=["noop"]), ApiMetrics(tools=["noop"])
    one.record_event(started("a", "noop"))
    one.record_event(finished("a", "noop"))
    assert sample(scrape(one), "toolq_tool_calls_total", tool="noop", outcome="ok") == 1
    assert sample(scrape(other), "toolq_tool_calls_total", tool="noop", outcome="ok") is None


def test_queue_depths_show_the_last_reading_and_nothing_stale() -> None:
    metrics = ApiMetrics()
    metrics.set_queue_depths({"tools": 7, "sandbox": 0})
    text = scrape(metrics)
    assert sample(text, "toolq_queue_depth", pool="tools") == 7
    assert sample(text, "toolq_queue_depth", pool="sandbox") == 0
    metrics.set_queue_depths(None)
    assert sample(scrape(metrics), "toolq_queue_depth", pool="tools") is None


async def scrape_app(queue_depths: object) -> httpx.Response:
    app = create_app(
        api_settings(),
        redis=fakeredis.FakeAsyncRedis(),
        executor=lambda *_: StubExecutor(),
        queue_depths=queue_depths,  # type: ignore[arg-type]
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://toolq", headers=AUTH) as client,
    ):
        return await client.get("/metrics")


async def test_the_metrics_route_reads_queue_depths_at_scrape_time() -> None:
    readings = iter([{"tools": 3, "sandbox": 1}])

    def depths(_: OrchestratorSettings) -> Mapping[str, int]:
        return next(readings)

    response = await scrape_app(depths)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert sample(response.text, "toolq_queue_depth", pool="tools") == 3
    assert sample(response.text, "toolq_queue_depth", pool="sandbox") == 1
    assert sample(response.text, "toolq_tool_calls_in_flight") == 0


async def test_an_unreachable_broker_does_not_break_the_scrape() -> None:
    def depths(_: OrchestratorSettings) -> Mapping[str, int]:
        raise ConnectionRefusedError("broker down")

    response = await scrape_app(depths)
    assert response.status_code == 200
    assert sample(response.text, "toolq_queue_depth", pool="tools") is None
    assert "toolq_runs_total" in response.text
