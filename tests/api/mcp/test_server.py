"""The fleet's tools through the MCP server, over stdio and Streamable HTTP, on real workers."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
import redis
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from api.calls.fleet import read_manifest
from tests.api.mcp.conftest import (
    AUTH,
    Connect,
    ServedApi,
    fleet_env,
    http_session,
    mcp_refused,
    mcp_url,
)
from tests.conftest import WorkerFleet, wait_for
from tests.worker.sessions.helpers import processes_with, token

pytestmark = pytest.mark.integration


def text(result: types.CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def meta(result: types.CallToolResult, name: str) -> object:
    return (result.meta or {}).get(f"toolq/{name}")


async def test_lists_the_fleets_enabled_tools_with_their_schemas(
    connect: Connect, fleet: WorkerFleet
) -> None:
    client = redis.Redis.from_url(fleet.settings.redis_url)
    manifest = read_manifest(client)
    client.close()
    async with connect() as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
    offered = [s.name for s in manifest.values() if s.for_model and s.enabled_by_default]
    assert list(listed) == offered
    assert "run_bash" not in listed  # off unless asked for
    assert not any(name.startswith("toolq.") for name in listed)  # service operations
    write_file = manifest["write_file"]
    assert listed["write_file"].input_schema == write_file.parameters
    assert listed["write_file"].description == write_file.description
    assert listed["read_file"].annotations is not None
    assert listed["read_file"].annotations.idempotent_hint == manifest["read_file"].idempotent


async def test_calls_run_on_the_workers_in_the_sessions_workspace(
    connect: Connect, fleet: WorkerFleet
) -> None:
    async with connect(enable="run_bash") as session:
        names = [tool.name for tool in (await session.list_tools()).tools]
        assert "run_bash" in names
        written = await session.call_tool("write_file", {"path": "n.txt", "content": "hi mcp"})
        assert not written.is_error, text(written)
        read = await session.call_tool("read_file", {"path": "n.txt"})
        assert not read.is_error
        assert "hi mcp" in text(read)
        bash = await session.call_tool("run_bash", {"command": "wc -c < n.txt"})
        assert not bash.is_error, text(bash)
        assert json.loads(text(bash))["stdout"].strip() == "6"
        run_id = meta(written, "run_id")
        assert isinstance(run_id, str)
        assert (Path(fleet.settings.workspace_root) / run_id / "n.txt").read_text() == "hi mcp"
    assert meta(read, "run_id") == meta(bash, "run_id") == run_id
    assert str(meta(read, "worker")).count(":") == 1  # host:pid of the worker process
    assert isinstance(meta(bash, "duration_ms"), float)


async def test_failures_are_tool_errors_with_the_models_text(connect: Connect) -> None:
    async with connect(disable="write_file", tool_timeout_ms=1000) as session:
        names = [tool.name for tool in (await session.list_tools()).tools]
        assert "write_file" not in names
        disabled = await session.call_tool("write_file", {"path": "x", "content": "y"})
        off_by_default = await session.call_tool("remove", {"path": "x"})
        unknown = await session.call_tool("teleport", {})
        bad = await session.call_tool("read_file", {"path": 3, "colour": "red"})
        slow = await session.call_tool("slow_read", {"seconds": 30})
    assert disabled.is_error
    assert text(disabled) == "Error: tool 'write_file' is not available (it is disabled)."
    assert off_by_default.is_error
    assert "'remove' is not available" in text(off_by_default)
    assert unknown.is_error
    assert text(unknown).startswith("Error: tool 'teleport' was not found.")
    assert bad.is_error
    assert text(bad).startswith("Error: invalid arguments for read_file:")
    assert "'colour': unknown parameter" in text(bad)
    assert meta(bad, "error_kind") == "invalid_arguments"
    assert slow.is_error
    assert text(slow) == "Error: slow_read timed out after 1000 ms and was stopped."
    assert meta(slow, "error_kind") == "timeout"


async def test_two_sessions_work_in_two_workspaces(connect: Connect, fleet: WorkerFleet) -> None:
    root = Path(fleet.settings.workspace_root)
    async with connect() as first, connect() as second:
        await first.call_tool("write_file", {"path": "mine.txt", "content": "first"})
        await second.call_tool("write_file", {"path": "mine.txt", "content": "second"})
        read_first = await first.call_tool("read_file", {"path": "mine.txt"})
        read_second = await second.call_tool("read_file", {"path": "mine.txt"})
        runs = {meta(read_first, "run_id"), meta(read_second, "run_id")}
        assert {(root / str(run) / "mine.txt").read_text() for run in runs} == {"first", "second"}
    assert "first" in text(read_first)
    assert "second" in text(read_second)
    assert len(runs) == 2


async def test_a_sessions_workspace_is_removed_when_the_session_ends(
    connect: Connect, fleet: WorkerFleet
) -> None:
    root = Path(fleet.settings.workspace_root)
    async with connect() as session:
        written = await session.call_tool("write_file", {"path": "left.txt", "content": "x"})
        workspace = root / str(meta(written, "run_id"))
        assert (workspace / "left.txt").read_text() == "x"
    wait_for(lambda: not workspace.exists(), timeout=60, what=f"{workspace} to be removed")


def test_toolq_mcp_refuses_a_tool_the_fleet_lacks_before_serving(fleet: WorkerFleet) -> None:
    done = mcp_refused(["--enable", "teleport"], env=fleet_env(fleet))
    assert done.returncode == 1
    assert done.stdout == ""  # stdout is the protocol's alone
    assert "Cannot enable 'teleport': no worker serves it" in done.stderr


async def test_an_http_session_asking_for_a_tool_the_fleet_lacks_is_refused(
    served_api: ServedApi,
) -> None:
    async with http_session(served_api, enable="teleport") as session:
        with pytest.raises(MCPError, match="Cannot enable 'teleport'"):
            await session.list_tools()
        with pytest.raises(MCPError, match="Cannot enable 'teleport'"):
            await session.call_tool("read_file", {"path": "x"})


async def test_http_sessions_need_the_api_token(served_api: ServedApi) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        # The SDK's client says only that the server answered with an error (the 401 below).
        with pytest.raises(ExceptionGroup) as refused_session:
            async with http_session(served_api, headers=headers) as session:
                await session.list_tools()
        assert refused_session.group_contains(MCPError, match="error response")
    async with httpx2.AsyncClient() as http:
        refused = await http.post(f"{served_api.url}/mcp", json={})
    assert refused.status_code == 401
    assert "TOOLQ_API_TOKEN" in refused.json()["detail"]
    assert refused.headers["www-authenticate"] == "Bearer"


async def test_a_stateless_http_client_may_list_but_not_call(served_api: ServedApi) -> None:
    url = mcp_url(served_api)
    async with (
        httpx2.AsyncClient(headers=AUTH) as http,
        Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client,
    ):
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert "read_file" in names
        with pytest.raises(MCPError, match="keeps a workspace per MCP session"):
            await client.call_tool("read_file", {"path": "x"})


async def test_bash_session_keeps_its_shell_across_calls_and_ends_with_the_session(
    connect: Connect, fleet: WorkerFleet
) -> None:
    mark = token()
    async with connect(enable="bash_session") as session:
        assert "bash_session" in [tool.name for tool in (await session.list_tools()).tools]
        first = await session.call_tool(
            "bash_session",
            {
                "action": "type_submit",
                "input": f"mkdir -p sub && cd sub && export X=1; sleep {mark} &",
            },
        )
        assert not first.is_error, text(first)
        again = await session.call_tool(
            "bash_session", {"action": "type_submit", "input": "pwd; echo $X"}
        )
        assert not again.is_error, text(again)
        run_id = str(meta(again, "run_id"))
        workspace = Path(fleet.settings.workspace_root) / run_id
        assert json.loads(text(again))["output"] == f"{workspace}/sub\n1\n"
        assert processes_with(f"sleep {mark}")
    wait_for(lambda: not workspace.exists(), timeout=60, what=f"{workspace} to be removed")
    wait_for(lambda: not processes_with(f"sleep {mark}"), timeout=30, what="the shell's job to end")
