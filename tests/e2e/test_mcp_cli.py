"""An MCP server's tools through the toolq commands: listed by ``toolq tools``, called by a model
in ``toolq run``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from api.local.stack import worker_environment
from tests.conftest import StartModel, wait_for
from tests.e2e.commands import TOOLQ, clean_env, toolq
from tests.worker.mcp.conftest import McpFleet, mcp_fleet  # noqa: F401 - the fleet fixture

pytestmark = pytest.mark.e2e


def test_toolq_run_calls_a_hosted_mcp_tool(
    mcp_fleet: McpFleet,  # noqa: F811 - the fixture imported above
    start_model: StartModel,
) -> None:
    model = start_model(
        [
            {
                "content": "Shouting it.",
                "tool_calls": [
                    {"name": "demo__shout", "arguments": {"text": "{prompt}", "times": 2}},
                    {"name": "write_file", "arguments": {"path": "said.txt", "content": "ok"}},
                ],
            },
            {"content": "Done."},
        ]
    )
    env = clean_env() | worker_environment(mcp_fleet.settings)
    env |= {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "test"}
    done = toolq("run", "hello mcp", "--model", "scripted", "--json", env=env)
    assert done.returncode == 0, done.stderr
    transcript = json.loads(done.stdout)
    shout, write = transcript["tool_calls"]
    assert shout["name"] == "demo__shout"
    assert not shout["is_error"], shout["output"]
    assert shout["output"] == "HELLO MCP HELLO MCP"
    assert shout["worker"] == write["worker"]  # the tools worker, not the orchestrator
    assert transcript["answer"] == "Done."


def test_toolq_tools_lists_them_and_says_what_is_unavailable(
    mcp_fleet: McpFleet,  # noqa: F811 - the fixture imported above
) -> None:
    tools = toolq("tools", env=clean_env() | worker_environment(mcp_fleet.settings))
    assert tools.returncode == 0, tools.stderr
    shout = next(line for line in tools.stdout.splitlines() if "demo__shout" in line)
    assert "tools" in shout
    assert "at most once" in shout
    unavailable = next(line for line in tools.stdout.splitlines() if "ghost__*" in line)
    assert unavailable.startswith("unavailable ghost__* on tools-")
    assert "MCP server 'ghost' did not start" in unavailable


def test_a_bad_servers_file_stops_toolq_at_start(tmp_path: Path) -> None:
    servers = tmp_path / "servers.json"
    servers.write_text(json.dumps([{"name": "x", "command": "y", "pool": "gpu"}]))
    done = toolq("tools", env=clean_env() | {"TOOLQ_MCP_SERVERS": str(servers)})
    assert done.returncode == 2
    assert done.stderr == (
        f"error: TOOLQ_MCP_SERVERS: {servers}: server 1 ('x'): pool: Input should be 'tools' "
        "or 'sandbox'\n"
    )


def _marked(marker: bytes) -> set[int]:
    """Processes whose environment carries ``marker``: the toolq started with it and all that it
    started."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                found.add(int(proc.name))
        except OSError:
            continue
    return found


async def test_toolq_mcp_on_a_local_stack_leaves_nothing_running() -> None:
    run = uuid.uuid4().hex
    marker = f"MCP_TEST_RUN={run}".encode()
    params = StdioServerParameters(
        command=TOOLQ, args=["mcp"], env=clean_env() | {"MCP_TEST_RUN": run}
    )
    async with Client(params) as client:
        assert len(_marked(marker)) >= 4  # toolq mcp, its Redis, a worker of each pool
        written = await client.call_tool("write_file", {"path": "a.txt", "content": "local"})
        read = await client.call_tool("read_file", {"path": "a.txt"})
    assert not written.is_error
    block = read.content[0]
    assert isinstance(block, types.TextContent)
    assert "local" in block.text
    wait_for(
        lambda: not _marked(marker),
        timeout=20,
        what="toolq mcp and its local stack to stop",
    )
