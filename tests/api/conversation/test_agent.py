"""The Agent on the real openai client, a scripted model over HTTP, and real workers."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from api.conversation.agent import Agent, AgentOptions
from api.conversation.events import FinalAnswer, TextDelta, ToolCallFinished, ToolCallStarted
from api.exceptions import ModelError
from api.model.client import ChatModel, RetryPolicy
from api.scripted.script import Script
from api.scripted.server import ScriptedServer
from api.settings import get_settings
from tests.conftest import WorkerFleet, orchestrator_settings, wait_for
from worker.contract.settings import get_worker_settings
from worker.exceptions import DuplicateToolError
from worker.tools.functions import tool
from worker.tools.interface import ExecutableTool

pytestmark = pytest.mark.integration


def call(name: str, arguments: dict[str, Any] | str, id: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "arguments": arguments}
    if id is not None:
        spec["id"] = id
    return spec


@pytest.fixture
def scripted() -> Iterator[list[ScriptedServer]]:
    servers: list[ScriptedServer] = []
    yield servers
    for server in servers:
        server.stop()


@dataclass
class Agents:
    """Agents on the session's fleet, each talking to a scripted model of its own."""

    fleet: WorkerFleet
    servers: list[ScriptedServer]

    def make(self, steps: list[Any], policy: RetryPolicy | None = None, **options: Any) -> Agent:
        server = ScriptedServer(Script.from_steps(steps))
        server.start()
        self.servers.append(server)
        client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0, timeout=10)
        retries = policy or RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)
        return Agent(
            ChatModel(client, retries),
            AgentOptions(model="scripted", **options),
            settings=orchestrator_settings(self.fleet.settings),
        )

    def workspace(self, agent: Agent) -> Path:
        return Path(self.fleet.settings.workspace_root) / agent.run_id


@pytest.fixture
def agents(fleet: WorkerFleet, scripted: list[ScriptedServer]) -> Agents:
    return Agents(fleet, scripted)


async def test_a_turn_of_parallel_calls_runs_at_once_and_answers_in_order(agents: Agents) -> None:
    steps = [
        {
            "tool_calls": [
                call("rendezvous", {"name": "r"}, id="c-1"),
                call("write_file", {"path": "a.txt", "content": "alpha"}, id="c-2"),
                call("rendezvous", {"name": "r"}, id="c-3"),
            ]
        },
        {"tool_calls": [call("read_file", {"path": "a.txt"}, id="c-4")]},
        {"content": "All done."},
    ]
    async with agents.make(steps) as agent:
        answer = await agent.chat("go")
    assert answer == "All done."
    tool_messages = [m for m in agent.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c-1", "c-2", "c-3", "c-4"]
    assert tool_messages[0]["content"] == "met"
    assert tool_messages[2]["content"] == "met"
    assert tool_messages[3]["content"] == "alpha"
    assert agent.usage.total_tokens > 0
    assert all(r.worker and r.duration_ms > 0 for r in agent.tool_calls)


async def test_streaming_assembles_split_arguments_and_reports_tool_activity(
    agents: Agents,
) -> None:
    long_text = "streamed " * 40
    steps = [
        {
            "content": "Writing now.",
            "tool_calls": [call("write_file", {"path": "s.txt", "content": long_text})],
        },
        {"content": "The file is written and says what you asked."},
    ]
    agent = agents.make(steps)
    events = [e async for e in agent.stream_chat("write it")]
    await agent.close()
    assert (agents.workspace(agent) / "s.txt").read_text() == long_text
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert "Writing now." in text
    assert "The file is written" in text
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [e.name for e in started] == ["write_file"]
    assert json.loads(started[0].arguments)["content"] == long_text
    assert finished[0].is_error is False
    assert finished[0].worker
    assert isinstance(events[-1], FinalAnswer)
    assert events[-1].text == "The file is written and says what you asked."


async def test_a_commands_usage_reaches_the_record_its_event_and_the_transcript(
    agents: Agents,
) -> None:
    steps = [
        {
            "tool_calls": [
                call("run_bash", {"command": "sleep 30 & echo started"}, id="c-1"),
                call("write_file", {"path": "a.txt", "content": "alpha"}, id="c-2"),
            ]
        },
        {"content": "Done."},
    ]
    agent = agents.make(steps, enable=["run_bash"])
    events = [e async for e in agent.stream_chat("go")]
    await agent.close()

    bash, write = agent.tool_calls
    answer = json.loads(bash.output)
    assert bash.pool == "sandbox" and write.pool == "tools"
    assert bash.usage == answer["usage"]
    grouped = any(layer.startswith("cgroup") for layer in answer["isolation"])
    assert bash.usage is not None and bash.usage["killed_processes"] == (1 if grouped else None)
    assert write.usage is None
    finished = {e.id: e for e in events if isinstance(e, ToolCallFinished)}
    assert finished["c-1"].usage == bash.usage
    assert finished["c-1"].pool == "sandbox"
    assert agent.transcript()["tool_calls"][0]["usage"] == bash.usage


async def test_failing_calls_reach_the_model_and_the_rest_of_the_turn_runs(agents: Agents) -> None:
    steps = [
        {
            "tool_calls": [
                call("no_such_tool", {}, id="u"),
                call("remove", {"path": "x"}, id="d"),
                call("read_file", '{"path": ', id="j"),
                call("read_file", {"path": 7}, id="t"),
                call("read_file", {"path": "missing.txt"}, id="e"),
                call("slow_read", {"seconds": 30}, id="s"),
                call("write_file", {"path": "ok.txt", "content": "fine"}, id="ok"),
            ]
        },
        {"content": "Recovered."},
    ]
    async with agents.make(steps, tool_timeout_ms=1500) as agent:
        answer = await agent.chat("try things")
    assert answer == "Recovered."
    out = {m["tool_call_id"]: m["content"] for m in agent.messages if m["role"] == "tool"}
    assert "not found" in out["u"]
    assert "not available" in out["d"]
    assert "not valid JSON" in out["j"]
    assert "'path'" in out["t"]
    assert "missing.txt" in out["e"]
    assert "timed out" in out["s"]
    assert (agents.workspace(agent) / "ok.txt").read_text() == "fine"
    kinds = {r.id: r.error_kind for r in agent.tool_calls}
    assert kinds == {
        "u": "unknown_tool",
        "d": "tool_disabled",
        "j": "invalid_arguments",
        "t": "invalid_arguments",
        "e": "tool_error",
        "s": "timeout",
        "ok": None,
    }


class Shout(ExecutableTool):
    name = "shout"
    description = "Runs in the orchestrator."

    def execute(self, args: dict[str, Any]) -> str:
        return "HEY"


async def test_tool_management(agents: Agents) -> None:
    steps = [
        {"tool_calls": [call("shout", {}), call("remove", {"path": "gone"})]},
        {"content": "ok"},
    ]
    agent = agents.make(steps)
    names = [t["function"]["name"] for t in agent.get_tools()]
    assert "read_file" in names
    assert "remove" not in names
    assert "run_bash" not in names
    with pytest.raises(ValueError, match="no worker serves"):
        agent.enable_tool("teleport")
    agent.add_tool(Shout())
    agent.enable_tool("remove")
    agent.disable_tool("read_file")
    names = [t["function"]["name"] for t in agent.get_tools()]
    assert "shout" in names
    assert "remove" in names
    assert "read_file" not in names
    (agents.workspace(agent)).mkdir(parents=True, exist_ok=True)
    (agents.workspace(agent) / "gone").write_text("x")
    await agent.chat("go")
    records = {r.name: r for r in agent.tool_calls}
    assert records["shout"].output == "HEY"
    assert records["shout"].worker == "orchestrator"
    assert not records["remove"].is_error
    assert not (agents.workspace(agent) / "gone").exists()
    agent.remove_tool("shout")
    assert "shout" not in [t["function"]["name"] for t in agent.get_tools()]
    await agent.close()


async def test_context_changes_are_seen_by_the_next_call(agents: Agents) -> None:
    agent = agents.make([{"content": "hello there"}], system_prompt="first")
    await agent.chat("hi")
    agent.set_system_prompt("second")
    where = await agent.save_context("before clearing")
    assert "session_context.json" in where
    saved = json.loads((agents.workspace(agent) / "session_context.json").read_text())
    assert saved["system_prompt"] == "second"
    assert saved["reason"] == "before clearing"
    assert [m["content"] for m in saved["session_context"]] == ["hi", "hello there"]
    agent.clear_context()
    await agent.save_context("after clearing")
    saved = json.loads((agents.workspace(agent) / "session_context.json").read_text())
    assert saved["session_context"] == []
    await agent.close()


async def test_the_turn_limit_stops_a_model_that_never_answers(agents: Agents) -> None:
    steps = [{"tool_calls": [call("noop", {})]}] * 10
    async with agents.make(steps, max_turns=3) as agent:
        answer = await agent.chat("loop")
    assert "turn limit of 3" in answer
    assert agent.stop_reason == "max_turns"
    assert len(agent.tool_calls) == 3


async def test_the_token_limit_stops_before_the_next_model_request(agents: Agents) -> None:
    steps = [{"tool_calls": [call("noop", {})]}] * 10
    async with agents.make(steps, token_limit=150) as agent:
        answer = await agent.chat("loop")
    assert agent.stop_reason == "token_limit"
    assert answer.startswith("Stopped: the token limit of 150 tokens was reached")
    # Every turn costs the scripted model's count of the messages; the last one crossed 150.
    assert agent.usage.total_tokens >= 150
    turns = [m for m in agent.messages if m["role"] == "assistant"]
    assert 1 < len(turns) < 10
    assert len(agent.tool_calls) == len(turns)  # the calls of the last turn were carried out


@pytest.mark.parametrize("stream", [False, True])
async def test_the_time_limit_stops_a_slow_model_and_a_slow_tool(
    agents: Agents, stream: bool
) -> None:
    stall_s = 30
    slow_model = [{"content": "late", "fault": {"kind": "stall", "seconds": stall_s}}]
    async with agents.make(slow_model, time_limit_s=0.5) as agent:
        started = time.monotonic()
        final = await final_answer(agent, "hi", stream)
    assert time.monotonic() - started < stall_s  # stopped at its limit, the model not waited for
    assert agent.stop_reason == "time_limit" and final.stop_reason == "time_limit"
    assert "time limit of 0.5 s" in final.text

    slow_tool = [
        {
            "tool_calls": [
                call("noop", {}, id="quick"),
                call("slow_read", {"seconds": 5}, id="slow"),
            ]
        },
        {"content": "never"},
    ]
    async with agents.make(slow_tool, time_limit_s=1.5) as agent:
        final = await final_answer(agent, "hi", stream)
    assert agent.stop_reason == "time_limit"
    outcomes = {record.id: (record.is_error, record.error_kind) for record in agent.tool_calls}
    assert outcomes == {"quick": (False, None), "slow": (True, "time_limit")}
    # Every call of the transcript still has its answer.
    assert [m["tool_call_id"] for m in agent.messages if m["role"] == "tool"] == ["quick", "slow"]


async def final_answer(agent: Agent, prompt: str, stream: bool) -> FinalAnswer:
    if not stream:
        text = await agent.chat(prompt)
        assert agent.stop_reason is not None
        return FinalAnswer(text, agent.stop_reason)
    events = [event async for event in agent.stream_chat(prompt)]
    final = events[-1]
    assert isinstance(final, FinalAnswer)
    return final


async def test_a_model_api_that_keeps_failing_ends_only_that_conversation(agents: Agents) -> None:
    broken = agents.make(
        [{"content": "never", "fault": {"kind": "status", "status": 500, "times": 10}}],
    )
    with pytest.raises(ModelError, match="500"):
        await broken.chat("hi")
    await broken.close()
    flaky = agents.make(
        [{"content": "after a hiccup", "fault": {"kind": "status", "status": 503, "times": 1}}],
    )
    assert await flaky.chat("hi") == "after a hiccup"
    await flaky.close()


@tool
def shout(text: str, times: int = 1) -> str:
    """Says it louder.

    Args:
        text: What to say.
        times: How many times.
    """
    return " ".join([text.upper()] * times)


def convert(amount: float, to: str) -> dict[str, Any]:
    return {"amount": amount, "to": to, "converted": round(amount * 1.1, 2)}


CONVERT = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "to": {"type": "string", "enum": ["USD", "EUR"]},
    },
    "required": ["amount", "to"],
    "additionalProperties": False,
}


async def test_function_and_json_schema_tools_run_beside_the_fleets(agents: Agents) -> None:
    steps = [
        {
            "tool_calls": [
                call("shout", {"text": "hi", "times": 2}, id="f-1"),
                call("shout", {"text": "hi", "times": "many"}, id="f-2"),
                call("convert", {"amount": 10, "to": "EUR"}, id="s-1"),
                call("convert", {"amount": 10, "to": "GBP"}, id="s-2"),
                call("write_file", {"path": "f.txt", "content": "fleet"}, id="w"),
            ]
        },
        {"content": "Converted."},
    ]
    agent = agents.make(steps)
    agent.add_tool(shout)
    agent.add_tool(tool(convert, description="Converts money.", parameters=CONVERT))
    schemas = {t["function"]["name"]: t["function"] for t in agent.get_tools()}
    async with agent:
        assert await agent.chat("go") == "Converted."

    assert schemas["convert"]["parameters"] == CONVERT
    assert schemas["shout"]["parameters"]["properties"]["text"]["description"] == "What to say."
    out = {r.id: r for r in agent.tool_calls}
    assert out["f-1"].output == "HI HI"
    assert out["f-1"].worker == "orchestrator"
    assert out["f-2"].error_kind == "invalid_arguments"
    assert out["f-2"].output.startswith("Error: invalid arguments for shout: 'times': ")
    assert json.loads(out["s-1"].output)["converted"] == 11.0
    assert out["s-2"].output == (
        "Error: invalid arguments for convert: 'to': 'GBP' is not one of ['USD', 'EUR']."
    )
    assert out["w"].worker != "orchestrator" and not out["w"].is_error
    with pytest.raises(DuplicateToolError, match="shout"):
        agent.add_tool(shout)


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The environment of a user who configured nothing: no broker, no plugins."""
    for name in ("TOOLQ_BROKER_URL", "TOOLQ_RESULT_BACKEND", "TOOLQ_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOOLQ_WORKSPACE_ROOT", str(tmp_path))
    get_settings.cache_clear()
    get_worker_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()
    get_worker_settings.cache_clear()


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                found |= {int(child), *descendants(int(child))}
    return found


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def test_an_agent_with_no_broker_starts_its_own_fleet_and_close_stops_it(
    no_broker: Path, scripted: list[ScriptedServer]
) -> None:
    server = ScriptedServer(
        Script.from_steps(
            [
                {"tool_calls": [call("get_current_weather", {"location": "Paris"})]},
                {"content": "In Paris: {last_tool_result}"},
            ]
        )
    )
    server.start()
    scripted.append(server)
    before = descendants(os.getpid())

    client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    agent = Agent(client, AgentOptions(model="scripted"))
    started = descendants(os.getpid()) - before
    try:
        names = [t["function"]["name"] for t in agent.get_tools()]
        answer = await agent.chat("What is the weather in Paris?")
    finally:
        await agent.close()
        await client.close()

    assert "get_current_weather" in names  # served without TOOLQ_PLUGINS
    weather = json.loads(answer.removeprefix("In Paris: "))
    assert (weather["location"], weather["condition"]) == ("Paris", "Sunny")
    assert 65 <= weather["temperature_f"] <= 75
    assert agent.tool_calls[0].worker != "orchestrator"
    assert (no_broker / agent.run_id).is_dir()
    assert len(started) >= 3  # a redis-server and a worker per pool, with their children
    wait_for(lambda: all(gone(pid) for pid in started), 15, "the local stack to be gone")
