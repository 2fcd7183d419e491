"""A fleet hosting MCP servers: a ``tools`` worker of its own, on a Redis of its own (its tools
and its queue are no other test's), with the test MCP server, one that never starts, and one
for the other pool."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator

import pytest

from api.calls.dispatch import Dispatcher
from api.local.stack import LocalStack
from tests.conftest import REPO, Caller, RedisServer, fleet_settings
from worker.contract.settings import WorkerSettings

DEMO = {
    "name": "demo",
    "command": sys.executable,
    "args": ["-m", "tests.plugins.mcp_server"],
    "env": {"PYTHONPATH": str(REPO)},
    "pool": "tools",
}
SERVERS = [
    DEMO,
    {"name": "ghost", "command": "/nonexistent/mcp-server", "pool": "tools"},
    {**DEMO, "name": "boxed", "pool": "sandbox"},
]


class McpFleet:
    """One ``tools`` worker with one pool process, so every call meets the same server."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self._stack = LocalStack(settings, concurrency=1, pools=("tools",))

    def start(self) -> None:
        self._stack.start_workers(self.settings)

    def stop(self) -> None:
        self._stack.stop()

    def log(self, lines: int = 400) -> str:
        return self._stack.log_tail("worker-tools", lines)


@pytest.fixture(scope="module")
def mcp_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpFleet]:
    where = tmp_path_factory.mktemp("mcp-fleet")
    servers = where / "servers.json"
    servers.write_text(json.dumps(SERVERS))
    redis_server = RedisServer(where)
    redis_server.start()
    root = where / "workspaces"
    root.mkdir()
    settings = fleet_settings(redis_server.url, root, mcp_servers=servers)
    fleet = McpFleet(settings)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()
        redis_server.stop()


@pytest.fixture
async def mcp_call(mcp_fleet: McpFleet) -> AsyncIterator[Caller]:
    async with Dispatcher(mcp_fleet.settings) as dispatcher:
        yield Caller(dispatcher, mcp_fleet.settings, "run-mcp-hosting")
