"""The Agent with its tools in its own process (``in_process=True``): no Redis, no workers. The
fleet's tools run here through the worker's own runner, so their answers are capped and their
calls stopped as on a real fleet; local tools run under the same deadlines as a worker's, and
their failures are logged."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from api.calls.dispatch import Dispatcher
from api.conversation.agent import Agent, AgentOptions
from api.scripted.script import Script
from api.scripted.server import ScriptedServer
from api.settings import OrchestratorSettings
from tests.conftest import TEST_PLUGINS, Caller, WorkerFleet
from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolCallResult
from worker.tools.functions import tool


def call(name: str, arguments: dict[str, Any], id: str) -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "id": id}


class Models:
    """Scripted model servers and the clients that talk to them, closed after the test."""

    def __init__(self) -> None:
        self.servers: list[ScriptedServer] = []
        self.clients: list[AsyncOpenAI] = []

    def client_for(self, steps: list[Any]) -> AsyncOpenAI:
        server = ScriptedServer(Script.from_steps(steps))
        server.start()
        self.servers.append(server)
        client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0, timeout=10)
        self.clients.append(client)
        return client


@pytest.fixture
async def model() -> AsyncIterator[Models]:
    models = Models()
    yield models
    for client in models.clients:
        await client.close()
    for server in models.servers:
        server.stop()


def agent_on(
    models: Models, steps: list[Any], root: Path, plugins: list[str] | None = None, **options: Any
) -> Agent:
    return Agent(
        models.client_for(steps),
        AgentOptions(model="scripted", **options),
        settings=OrchestratorSettings(broker_url=None, default_timeout_ms=10_000),
        in_process=True,
        worker_settings=WorkerSettings(workspace_root=root, plugins=plugins or []),
    )


async def test_in_process_the_fleets_tools_run_here(model: Models, tmp_path: Path) -> None:
    steps = [
        {
            "tool_calls": [
                call("write_file", {"path": "note.txt", "content": "in process"}, "c-1"),
                call("get_current_weather", {"location": "Lyon"}, "c-2"),
            ]
        },
        {"tool_calls": [call("run_bash", {"command": "cat note.txt && mkdir -p out"}, "c-3")]},
        {"content": "Done: {last_tool_result}"},
    ]
    async with agent_on(model, steps, tmp_path, enable=["run_bash"]) as agent:
        answer = await agent.chat("note it, check the weather, then look")

    assert answer.startswith("Done: ")
    records = {r.id: r for r in agent.tool_calls}
    assert {r.worker for r in records.values()} == {"orchestrator"}
    weather = json.loads(records["c-2"].output)
    assert weather["condition"] == "Sunny" and weather["location"] == "Lyon"
    assert 65 <= weather["temperature_f"] <= 75
    bash = json.loads(records["c-3"].output)
    assert (bash["stdout"], bash["exit_code"]) == ("in process", 0), bash
    # What its command used comes back beside the answer, as from a worker.
    assert records["c-3"].usage is not None and records["c-3"].usage == bash["usage"]
    assert (tmp_path / agent.run_id / "out").is_dir()


async def test_a_slow_local_tool_is_answered_as_a_timeout_at_its_deadline(
    model: Models, tmp_path: Path
) -> None:
    gate = threading.Event()

    def slow_lookup(key: str) -> str:
        """Looks a key up in a very slow index.

        Args:
            key: What to look up.
        """
        gate.wait(30)
        return "found"

    steps = [
        {"tool_calls": [call("slow_lookup", {"key": "k"}, "c-slow")]},
        {"content": "Going on without it: {last_tool_result}"},
    ]
    agent = agent_on(model, steps, tmp_path, tool_timeout_ms=500)
    agent.add_tool(slow_lookup)
    try:
        answer = await agent.chat("look it up")
    finally:
        gate.set()
        await agent.close()

    [record] = agent.tool_calls
    assert record.error_kind == "timeout" and record.is_error
    assert record.output == "Error: slow_lookup timed out after 500 ms and was stopped."
    assert 500 <= record.wall_ms < 30_000  # answered at its limit, not when the gate opened
    assert answer == f"Going on without it: {record.output}"


async def test_a_local_tool_that_raises_is_logged_with_the_run_and_call_ids(
    model: Models, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "canary-local-5e0f"

    @tool(name="explode")
    def explode(payload: str) -> str:
        """Raises, whatever it is given.

        Args:
            payload: Text that must never reach a log.
        """
        raise RuntimeError("disk on fire")

    steps = [{"tool_calls": [call("explode", {"payload": secret}, "c-boom")]}, {"content": "ok"}]
    async with agent_on(model, steps, tmp_path) as agent:
        agent.add_tool(explode)
        with caplog.at_level(logging.WARNING, logger="worker.tools.registry"):
            await agent.chat("go")

    assert agent.tool_calls[0].output == "Error executing explode: disk on fire"
    [record] = [r for r in caplog.records if r.name == "worker.tools.registry"]
    assert (record.run_id, record.tool_call_id) == (agent.run_id, "c-boom")  # type: ignore[attr-defined]
    assert record.exc_info is not None and 'raise RuntimeError("disk on fire")' in caplog.text
    assert secret not in caplog.text


#: A plugin's answer four times the fleet's cap: ``repeat`` of a 99-byte word, 2,001 times.
BIG_ANSWER = {"word": "y" * 99, "times": 2001}


async def on_fleet(
    fleet: WorkerFleet, tool_name: str, arguments: dict[str, Any], **how: Any
) -> ToolCallResult:
    """The same call on a real fleet (Redis, Celery workers with the same plugins)."""
    async with Dispatcher(fleet.settings) as dispatcher:
        caller = Caller(dispatcher, fleet.settings, f"run-{uuid.uuid4().hex[:12]}")
        return await caller(tool_name, arguments, **how)


@pytest.mark.integration
async def test_an_in_process_plugins_big_answer_is_capped_as_on_the_fleet(
    model: Models, tmp_path: Path, fleet: WorkerFleet
) -> None:
    steps = [{"tool_calls": [call("repeat", BIG_ANSWER, "c-big")]}, {"content": "ok"}]
    async with agent_on(model, steps, tmp_path, plugins=TEST_PLUGINS) as agent:
        await agent.chat("say it many times")
    there = await on_fleet(fleet, "repeat", BIG_ANSWER)

    [here] = agent.tool_calls
    assert len(" ".join(["y" * 99] * 2001)) >= 200_000
    assert fleet.settings.output_cap_bytes == DEFAULT_OUTPUT_CAP_BYTES  # one cap both ways
    assert len(here.output.encode()) <= DEFAULT_OUTPUT_CAP_BYTES
    assert here.truncated and there.truncated
    assert here.output == there.output  # the same cut, the same notice of the full size
    assert (here.is_error, here.error_kind) == (there.is_error, there.error_kind)
    assert here.usage is None and there.usage is None  # no command ran: nothing to report
    # The model is sent the capped answer, not the whole.
    assert agent.messages[-2] == {"role": "tool", "tool_call_id": "c-big", "content": here.output}


@pytest.mark.integration
async def test_an_in_process_plugin_past_its_limit_times_out_as_on_the_fleet(
    model: Models, tmp_path: Path, fleet: WorkerFleet
) -> None:
    slow = {"seconds": 20}
    steps = [{"tool_calls": [call("slow_read", slow, "c-slow")]}, {"content": "ok"}]
    agent = agent_on(model, steps, tmp_path, plugins=TEST_PLUGINS, tool_timeout_ms=500)
    async with agent:
        await agent.chat("take your time")
    there = await on_fleet(fleet, "slow_read", slow, timeout_ms=500)

    [here] = agent.tool_calls
    assert (here.error_kind, there.error_kind) == ("timeout", "timeout")
    assert here.is_error and there.is_error
    assert here.output == there.output == "Error: slow_read timed out after 500 ms and was stopped."
    assert here.wall_ms < 20_000  # answered at its limit, not when the tool ended


async def test_an_in_process_tool_the_settings_switch_off_is_refused_as_on_the_fleet(
    model: Models, tmp_path: Path
) -> None:
    steps = [
        {"tool_calls": [call("write_file", {"path": "a.txt", "content": "b"}, "c-1")]},
        {"content": "ok"},
    ]
    agent = Agent(
        model.client_for(steps),
        AgentOptions(model="scripted", enable=["write_file"]),
        settings=OrchestratorSettings(broker_url=None),
        in_process=True,
        worker_settings=WorkerSettings(
            workspace_root=tmp_path, plugins=[], disabled_tools=["write_file"]
        ),
    )
    async with agent:
        await agent.chat("write")

    [record] = agent.tool_calls
    assert record.error_kind == "tool_disabled"
    assert record.output == "Error: tool 'write_file' is not available (disabled on this fleet)."
    assert not (tmp_path / agent.run_id / "a.txt").exists()
