"""A session's own limits over MCP: ``toolq mcp --limits`` and ``/mcp?limits=``, applied by the
workers to the session's commands, and refused in one line above the fleet's maximums."""

from __future__ import annotations

import pytest
from mcp.shared.exceptions import MCPError
from starlette.datastructures import QueryParams

from api.mcp.http import tool_choice
from tests.api.mcp.conftest import Connect, ServedApi, fleet_env, http_session, mcp_refused
from tests.api.mcp.test_server import text
from tests.conftest import WorkerFleet
from tests.worker.test_run_limits import ALLOCATE_200_MB
from worker.contract.run_limits import RunLimits
from worker.contract.wire import CommandAnswer

pytestmark = pytest.mark.integration


async def test_a_session_limited_to_64_mb_cannot_hold_200_mb(connect: Connect) -> None:
    async with connect(enable="run_bash", limits="memory_mb=64,pids=16") as session:
        called = await session.call_tool("run_bash", {"command": ALLOCATE_200_MB})
    assert not called.is_error, text(called)
    answer = CommandAnswer.model_validate_json(text(called))
    assert answer.exit_code != 0 and "held" not in answer.stdout
    assert answer.usage is not None and answer.usage.limits is not None
    assert answer.usage.limits.memory_mb == 64 and answer.usage.limits.pids == 16


async def test_a_session_without_limits_holds_200_mb(connect: Connect) -> None:
    async with connect(enable="run_bash") as session:
        called = await session.call_tool("run_bash", {"command": ALLOCATE_200_MB})
    answer = CommandAnswer.model_validate_json(text(called))
    assert answer.stdout == "held\n", answer.stderr


def test_toolq_mcp_refuses_limits_above_the_maximums_in_one_line(fleet: WorkerFleet) -> None:
    done = mcp_refused(["--limits", "memory_mb=1048576"], env=fleet_env(fleet))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: the run asks more than this fleet allows: memory_mb=1048576 (at most 4096)"
    ]


async def test_an_http_session_asking_above_the_maximums_is_refused(
    served_api: ServedApi,
) -> None:
    async with http_session(served_api, enable="run_bash", limits="pids=999999") as session:
        with pytest.raises(MCPError, match=r"pids=999999 \(at most 1024\)"):
            await session.call_tool("run_bash", {"command": "touch ran"})


async def test_a_malformed_limits_query_says_what_is_wrong(served_api: ServedApi) -> None:
    async with http_session(served_api, limits="memory=64") as session:
        with pytest.raises(MCPError, match="limits"):
            await session.list_tools()


def test_limits_in_the_url_are_read_as_on_the_command_line() -> None:
    assert tool_choice(QueryParams("limits=memory_mb=64,pids=8")).limits == RunLimits(
        memory_mb=64, pids=8
    )
    assert tool_choice(QueryParams("")).limits is None
