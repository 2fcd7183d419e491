"""One run per MCP session: kept while the session is in use, forgotten when it ends or idles."""

from __future__ import annotations

from typing import cast

import pytest

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.exceptions import NoWorkersError
from api.mcp.server import SessionRuns, ToolChoice
from tests.api.http.conftest import FLEET


class IdleDispatcher:
    """Sends nothing: these tests make sessions and never call a tool."""

    networks: dict[str, object] = {}
    limits: dict[str, object] = {}

    async def start(self) -> None:
        pass


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def sessions(clock: Clock, fleet: Fleet = FLEET) -> SessionRuns:
    async def current() -> Fleet:
        return fleet

    return SessionRuns(current, cast(Dispatcher, IdleDispatcher()), idle_timeout_s=60, clock=clock)


async def test_a_session_keeps_its_run_and_two_sessions_have_two() -> None:
    runs = sessions(Clock())
    first = await runs.tools("a", ToolChoice())
    assert await runs.tools("a", ToolChoice(enable=("run_bash",))) is first
    second = await runs.tools("b", ToolChoice())
    assert second.run_id != first.run_id
    assert first.run_id.startswith("mcp-")
    assert runs.open_sessions == 2


async def test_the_choice_of_tools_is_the_sessions_own() -> None:
    runs = sessions(Clock())
    default = await runs.tools("a", ToolChoice())
    chosen = await runs.tools("b", ToolChoice(disable=("read_file",), tool_timeout_ms=900))
    assert default.registry.is_tool_enabled("read_file")
    assert not chosen.registry.is_tool_enabled("read_file")
    with pytest.raises(ValueError, match="Cannot enable 'teleport'"):
        await runs.tools("c", ToolChoice(enable=("teleport",)))
    assert runs.open_sessions == 2


async def test_ended_and_idle_sessions_are_ended() -> None:
    clock = Clock()
    runs = sessions(clock)
    await runs.tools("ended", ToolChoice())
    kept = await runs.tools("kept", ToolChoice())
    runs.end("ended")
    assert runs.open_sessions == 1
    await runs.tools("idle", ToolChoice())
    clock.now = 50
    await runs.tools("kept", ToolChoice())
    clock.now = 100  # "idle" was last used 100 s ago, "kept" 50 s ago
    assert await runs.tools("kept", ToolChoice()) is kept
    assert runs.open_sessions == 1


async def test_a_fleet_without_tools_is_said() -> None:
    runs = sessions(Clock(), Fleet(tools={}))
    with pytest.raises(NoWorkersError):
        await runs.tools("a", ToolChoice())
