"""Where a conversation runs and where its tools run, as each command and the API decide it."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.calls.fleet import Fleet
from api.calls.remote_tool import RemoteTool
from api.conversation.agent_options import AgentOptions
from api.conversation.placement import (
    AgentsPool,
    ConversationSite,
    ConversationTools,
    Placement,
    ToolSite,
    fleet_started,
    place,
)
from api.settings import OrchestratorSettings
from tests.conftest import tool_spec
from worker.contract.settings import WorkerSettings
from worker.contract.wire import Served, ToolContextSnapshot, WorkerInfo
from worker.tools.registry import ToolRegistry

NO_BROKER = OrchestratorSettings(broker_url=None)
BROKER = OrchestratorSettings(broker_url="redis://127.0.0.1:1/0")


def worker(pool: Served) -> WorkerInfo:
    return WorkerInfo(worker=f"{pool}@h", pools=[pool], host="h", pid=1, started=0)


WEATHER = tool_spec("get_current_weather", "tools", description="The weather.")
RUN_BASH = tool_spec("run_bash", "sandbox", description="Run it.", enabled_by_default=False)
TOOLS_ONLY = Fleet(
    tools={spec.name: spec for spec in (WEATHER, RUN_BASH)}, workers={"tools": [worker("tools")]}
)
WITH_AGENTS = Fleet(tools=TOOLS_ONLY.tools, workers=TOOLS_ONLY.workers, agents=[worker("agents")])


def test_with_a_broker_a_conversation_and_its_tools_run_on_the_fleet() -> None:
    assert place(BROKER) == Placement(ConversationSite.HERE, ToolSite.FLEET)


def test_with_no_broker_the_tools_run_on_a_local_stack_of_the_tool_pools() -> None:
    placement = place(NO_BROKER)

    assert placement == Placement(ConversationSite.HERE, ToolSite.LOCAL_STACK)
    assert not placement.starts_agents_worker


def test_a_caller_that_brings_its_fleet_starts_nothing_whatever_the_settings() -> None:
    assert place(NO_BROKER, fleet_given=True).tools is ToolSite.FLEET
    assert place(NO_BROKER, fleet=TOOLS_ONLY).tools is ToolSite.FLEET


def test_in_process_the_tools_run_here_with_or_without_a_broker() -> None:
    for settings in (NO_BROKER, BROKER):
        placement = place(settings, in_process=True)
        assert placement == Placement(ConversationSite.HERE, ToolSite.IN_PROCESS)


def test_the_agents_pool_is_used_while_an_agents_worker_is_live() -> None:
    up = place(BROKER, agents_pool=AgentsPool.WHEN_LIVE, fleet=WITH_AGENTS)
    down = place(BROKER, agents_pool=AgentsPool.WHEN_LIVE, fleet=TOOLS_ONLY)
    unknown = place(BROKER, agents_pool=AgentsPool.WHEN_LIVE)

    assert up == Placement(ConversationSite.AGENTS_POOL, ToolSite.FLEET)
    assert up.on_agents_pool
    assert down == unknown == Placement(ConversationSite.HERE, ToolSite.FLEET)


def test_a_caller_that_never_uses_the_agents_pool_runs_here_even_while_it_is_up() -> None:
    assert not place(BROKER, fleet=WITH_AGENTS).on_agents_pool


def test_required_the_agents_pool_is_used_live_or_not() -> None:
    on_fleet = place(BROKER, agents_pool=AgentsPool.REQUIRED, fleet=TOOLS_ONLY)

    assert on_fleet == Placement(ConversationSite.AGENTS_POOL, ToolSite.FLEET)
    assert not on_fleet.starts_agents_worker  # the configured fleet's agents workers ask


def test_required_with_no_broker_the_local_stack_has_an_agents_worker() -> None:
    placement = place(NO_BROKER, agents_pool=AgentsPool.REQUIRED)

    assert placement == Placement(ConversationSite.AGENTS_POOL, ToolSite.LOCAL_STACK)
    assert placement.starts_agents_worker


def test_conversations_on_the_agents_pool_cannot_have_their_tools_in_process() -> None:
    with pytest.raises(ValueError, match="agents pool"):
        place(NO_BROKER, agents_pool=AgentsPool.REQUIRED, in_process=True)
    in_process = place(BROKER, agents_pool=AgentsPool.WHEN_LIVE, fleet=WITH_AGENTS, in_process=True)
    assert in_process == Placement(ConversationSite.HERE, ToolSite.IN_PROCESS)


def test_on_a_configured_fleet_nothing_is_started() -> None:
    with fleet_started(BROKER, place(BROKER)) as settings:
        assert settings is BROKER


def context() -> ToolContextSnapshot:
    return ToolContextSnapshot()


async def test_on_the_fleet_the_tools_are_its_proxies_switched_as_the_options_say() -> None:
    registry = ToolRegistry()
    tools = ConversationTools(
        place(BROKER, fleet=TOOLS_ONLY),
        registry,
        "run-1",
        AgentOptions(enable=["get_current_weather"], disable=["get_current_weather"]),
        context,
        settings=BROKER,
        fleet=TOOLS_ONLY,
    )
    try:
        assert tools.fleet is TOOLS_ONLY
        assert registry.get_tool_names() == ["get_current_weather", "run_bash"]
        assert all(isinstance(registry.get(n), RemoteTool) for n in registry.get_tool_names())
        assert not registry.is_tool_enabled("get_current_weather")  # disabled last
        assert not registry.is_tool_enabled("run_bash")  # off by default
        with pytest.raises(ValueError, match="no live worker serves its 'sandbox' pool"):
            tools.enable("run_bash")
        assert tools.environment is None
    finally:
        await tools.close()


async def test_in_process_the_workers_tools_are_built_here(tmp_path: Path) -> None:
    registry = ToolRegistry()
    tools = ConversationTools(
        place(NO_BROKER, in_process=True),
        registry,
        "run-1",
        AgentOptions(enable=["run_bash"]),
        context,
        settings=NO_BROKER,
        worker_settings=WorkerSettings(workspace_root=tmp_path, plugins=[]),
    )
    try:
        assert tools.fleet is None
        assert registry.is_tool_enabled("run_bash")
        # The fleet's kind of proxy, its calls run here: the model sees no service operation.
        names = registry.get_tool_names()
        assert all(isinstance(registry.get(n), RemoteTool) for n in names)
        assert "write_file" in names and not any(n.startswith("toolq.") for n in names)
    finally:
        await tools.close()


def test_in_process_there_is_no_image_to_run_the_tools_in(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="an image needs a fleet"):
        ConversationTools(
            place(NO_BROKER, in_process=True),
            ToolRegistry(),
            "run-1",
            AgentOptions(image="alpine:3"),
            context,
            settings=NO_BROKER,
            worker_settings=WorkerSettings(workspace_root=tmp_path, plugins=[]),
        )
