"""MCP servers' tools on a real worker: announced like any tool, run through the queue with the
same deadlines and caps, a crashing server restarted, a hanging call stopped at its deadline."""

from __future__ import annotations

import redis

from api.calls.fleet import live_workers, read_manifest
from tests.conftest import Caller, wait_for
from tests.worker.mcp.conftest import McpFleet
from worker.contract.wire import ToolCallResult

#: How long the stuck tools would take: far past their calls' deadlines.
STUCK_S = 120


def test_the_servers_tools_are_announced_with_their_schemas(mcp_fleet: McpFleet) -> None:
    client = redis.Redis.from_url(mcp_fleet.settings.redis_url)
    try:
        specs = read_manifest(client)
        (worker,) = live_workers(client, "tools")
    finally:
        client.close()
    mcp_tools = [name for name in specs if "__" in name]
    assert mcp_tools == [
        "demo__shout",
        "demo__whoami",
        "demo__fail",
        "demo__crash",
        "demo__hang",
        "demo__freeze",
        "demo__big",
    ]
    shout = specs["demo__shout"]
    assert shout.pool == "tools"
    assert not shout.idempotent
    assert shout.for_model and shout.enabled_by_default
    assert shout.description == "Says the text louder, ``times`` times."
    assert shout.parameters["required"] == ["text"]
    assert shout.parameters["properties"]["times"]["type"] == "integer"
    # The sandbox pool's server is started by sandbox workers only: this fleet has none.
    assert not any(name.startswith("boxed__") for name in specs)
    # A server that never starts: its tools are unavailable, the others served.
    problem = worker.unavailable["ghost__*"]
    assert "MCP server 'ghost' did not start" in problem
    assert "No such file or directory: '/nonexistent/mcp-server'" in problem
    assert "ghost" in mcp_fleet.log()
    assert "read_file" in specs


async def test_calls_are_answered_by_the_server(mcp_call: Caller) -> None:
    shout = await mcp_call("demo__shout", {"text": "hi", "times": 2})
    assert not shout.is_error, shout.output
    assert shout.output == "HI HI"
    assert shout.worker is not None
    failed = await mcp_call("demo__fail", {"why": "the moon is full"})
    assert failed.is_error
    assert failed.error_kind == "tool_error"
    assert failed.output.startswith("Error executing demo__fail: ")
    assert "the moon is full" in failed.output


async def test_bad_arguments_are_refused_against_the_servers_schema(mcp_call: Caller) -> None:
    bad = await mcp_call("demo__shout", {"times": "twice"})
    assert bad.is_error
    assert bad.error_kind == "invalid_arguments"
    assert bad.output.startswith("Error: invalid arguments for demo__shout: ")
    assert "'text': Field required" in bad.output
    assert "'times': 'twice' is not of type 'integer'" in bad.output


async def test_an_answer_is_capped_like_any_tools(mcp_call: Caller) -> None:
    big = await mcp_call("demo__big", {"kilobytes": 200})
    assert not big.is_error
    assert big.truncated
    assert len(big.output.encode()) <= mcp_call.settings.output_cap_bytes


async def test_a_server_that_crashes_mid_call_is_restarted(mcp_call: Caller) -> None:
    before = await mcp_call("demo__whoami", {})
    crashed = await mcp_call("demo__crash", {})
    assert crashed.is_error
    assert crashed.error_kind == "tool_error"
    assert "the MCP server 'demo' stopped during the call" in crashed.output
    assert "being started again" in crashed.output
    after = await mcp_call("demo__whoami", {}, timeout_ms=20_000)
    assert not after.is_error, after.output
    assert after.output != before.output  # a new server process answered


async def test_a_call_that_hangs_past_its_deadline_is_stopped(mcp_call: Caller) -> None:
    before = await mcp_call("demo__whoami", {})
    hung = await mcp_call("demo__hang", {"seconds": STUCK_S}, timeout_ms=1500)
    assert_timed_out(hung, 1500)
    # The server took the cancellation and goes on serving, as it was.
    after = await mcp_call("demo__whoami", {})
    assert after.output == before.output


async def test_a_server_frozen_past_a_deadline_is_restarted(mcp_call: Caller) -> None:
    before = await mcp_call("demo__whoami", {})
    frozen = await mcp_call("demo__freeze", {"seconds": STUCK_S}, timeout_ms=1500)
    assert_timed_out(frozen, 1500)
    after = await mcp_call("demo__whoami", {}, timeout_ms=20_000)
    assert not after.is_error, after.output
    assert after.output != before.output


def assert_timed_out(result: ToolCallResult, timeout_ms: int) -> None:
    assert result.is_error
    assert result.error_kind == "timeout"
    assert result.output == f"Error: {result.tool} timed out after {timeout_ms} ms and was stopped."
    assert result.duration_ms < STUCK_S * 1000  # stopped at its deadline, not waited out


def test_the_worker_log_names_the_server_that_never_started(mcp_fleet: McpFleet) -> None:
    wait_for(
        lambda: "not serving ghost__*" in mcp_fleet.log(),
        timeout=10,
        what="the worker to log the server it cannot start",
    )
