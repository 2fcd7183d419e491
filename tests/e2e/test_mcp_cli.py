"""An MCP server's tools through the toolq commands: listed by ``toolq tools``, called by a model
in ``toolq run``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.local.stack import worker_environment
from api.scripted.script import Script
from api.scripted.server import ScriptedServer
from tests.e2e.test_cli import clean_env, toolq
from tests.worker.mcp.conftest import McpFleet, mcp_fleet  # noqa: F401 - the fleet fixture

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedServer]:
    script = Script.from_steps(
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
    with ScriptedServer(script) as server:
        yield server


def test_toolq_run_calls_a_hosted_mcp_tool(
    mcp_fleet: McpFleet,  # noqa: F811 - the fixture imported above
    model: ScriptedServer,
) -> None:
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
    assert "Invalid TOOLQ_ settings" in done.stderr
    assert "server 1 ('x'): pool: Input should be 'tools' or 'sandbox'" in done.stderr
