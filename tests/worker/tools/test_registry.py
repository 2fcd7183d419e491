"""The tool model: schemas from Args, registry bookkeeping, and execute that never raises."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from worker.exceptions import DuplicateToolError
from worker.tools.context import ToolContext
from worker.tools.interface import ExecutableTool
from worker.tools.registry import ToolRegistry


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="What to echo.")
    times: int = 1


class EchoTool(ExecutableTool):
    name = "echo"
    description = "Echoes text."
    Args = EchoArgs

    def execute(self, args: dict[str, Any]) -> str:
        return str(args["text"]) * int(args["times"])


class AsyncEchoTool(EchoTool):
    name = "async_echo"

    async def execute(self, args: dict[str, Any]) -> str:  # type: ignore[override]
        await asyncio.sleep(0)
        return str(args["text"]).upper()


class NoParamsTool(ExecutableTool):
    name = "ping"
    description = "Answers pong."

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"answer": "pong", "args": args}


class FailingTool(ExecutableTool):
    name = "fails"
    description = "Always raises."

    def execute(self, args: dict[str, Any]) -> str:
        raise RuntimeError("disk on fire")


class UnserialisableTool(ExecutableTool):
    name = "weird"
    description = "Returns what JSON cannot hold."

    def execute(self, args: dict[str, Any]) -> object:
        return {"value": object()}


class ContextReader(ExecutableTool):
    name = "whoami"
    description = "Reads the system prompt through the context."

    def __init__(self, context: ToolContext) -> None:
        self.context = context

    def execute(self, args: dict[str, Any]) -> str:
        return self.context.system_prompt


def registry_with(*tools: ExecutableTool) -> ToolRegistry:
    registry = ToolRegistry()
    for tool in tools:
        registry.register(tool)
    return registry


def test_schema_is_derived_from_args_and_named_after_the_tool() -> None:
    schema = EchoTool().get_schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "echo"
    assert function["description"] == "Echoes text."
    params = function["parameters"]
    assert params["type"] == "object"
    assert params["properties"]["text"]["type"] == "string"
    assert params["properties"]["text"]["description"] == "What to echo."
    assert params["required"] == ["text"]
    assert params["additionalProperties"] is False


def test_a_tool_without_args_has_an_empty_object_schema() -> None:
    params = NoParamsTool().get_schema()["function"]["parameters"]
    assert params["type"] == "object"
    assert params["properties"] == {}


def test_registration_order_enabled_state_and_listing() -> None:
    registry = ToolRegistry()
    assert registry.get_tool_names() == []
    registry.register(EchoTool())
    registry.register(NoParamsTool())
    registry.disable("echo")
    assert registry.get_tool_names() == ["echo", "ping"]
    assert [s["function"]["name"] for s in registry.get_enabled_schemas()] == ["ping"]
    assert registry.is_tool_enabled("ping")
    assert not registry.is_tool_enabled("echo")
    assert not registry.is_tool_enabled("nope")
    assert registry.has_tool("echo") and not registry.has_tool("nope")
    listed = {t["name"]: t for t in registry.list_tools()}
    assert listed["echo"]["enabled"] is False
    assert listed["echo"]["description"] == "Echoes text."
    assert "text" in listed["echo"]["parameters"]["properties"]
    registry.enable("echo")
    assert len(registry.get_enabled_schemas()) == 2


def test_duplicate_name_is_refused_and_the_first_tool_stays() -> None:
    first = EchoTool()
    registry = registry_with(first)
    with pytest.raises(DuplicateToolError, match="echo") as info:
        registry.register(EchoTool())
    assert isinstance(info.value, ValueError)
    assert registry.get("echo") is first


def test_unregister_removes_and_ignores_unknown_names() -> None:
    registry = registry_with(EchoTool())
    registry.unregister("nope")
    registry.unregister("echo")
    assert registry.get_tool_names() == []


async def test_execute_with_dict_and_raw_json_fills_defaults() -> None:
    registry = registry_with(EchoTool(), AsyncEchoTool())
    assert await registry.execute("echo", {"text": "ab", "times": 2}) == "abab"
    assert await registry.execute("echo", '{"text": "x"}') == "x"
    assert await registry.execute("async_echo", {"text": "hi"}) == "HI"


async def test_non_string_results_are_serialised_to_json() -> None:
    registry = registry_with(NoParamsTool())
    assert json.loads(await registry.execute("ping", "")) == {"answer": "pong", "args": {}}


async def test_unknown_and_disabled_tools_get_clear_messages() -> None:
    registry = registry_with(EchoTool())
    assert "not found" in await registry.execute("nope", {})
    registry.disable("echo")
    message = await registry.execute("echo", {"text": "x"})
    assert "not available" in message and "echo" in message


async def test_an_unknown_tool_is_told_only_the_tools_it_may_call() -> None:
    registry = registry_with(EchoTool(), NoParamsTool(), FailingTool())
    registry.disable(FailingTool.name)

    outcome = await registry.run("nope", {})

    assert outcome.error_kind == "unknown_tool"
    assert outcome.output == (
        f"Error: tool 'nope' was not found. Available tools: {EchoTool.name}, {NoParamsTool.name}."
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ('{"text": ', ["not valid JSON"]),
        ('{"text": "a', ["(Unterminated string starting at line 1 column 10)"]),
        ("[1, 2]", ["expected a JSON object"]),
        ({}, ["'text'", "Field required"]),
        ({"text": "a", "times": "many"}, ["'times'", "integer"]),
        ({"text": "a", "colour": "red"}, ["'colour'", "unknown parameter"]),
        ({"times": [], "colour": 1}, ["'text'", "'times'", "'colour'"]),
    ],
)
async def test_bad_arguments_name_each_failing_parameter(
    args: dict[str, Any] | str, expected: list[str]
) -> None:
    ran: list[bool] = []

    class Watched(EchoTool):
        def execute(self, args: dict[str, Any]) -> str:
            ran.append(True)
            return "ran"

    registry = registry_with(Watched())
    outcome = await registry.run("echo", args)
    assert outcome.error_kind == "invalid_arguments"
    for fragment in expected:
        assert fragment in outcome.output
    assert ran == []


async def test_a_raising_tool_gives_exactly_the_error_line() -> None:
    registry = registry_with(FailingTool())
    assert await registry.execute("fails", {}) == "Error executing fails: disk on fire"


async def test_an_unserialisable_result_is_a_structured_error() -> None:
    registry = registry_with(UnserialisableTool())
    outcome = await registry.run("weird", {})
    assert outcome.error_kind == "unserializable_result"
    error = json.loads(outcome.output)
    assert error["error"] == "unserializable_result"
    assert "weird" in error["message"]


class Limit(Exception):
    """Stands for a worker's time-limit signal."""


class HitsItsLimit(ExecutableTool):
    name = "slow"
    description = "Hits its limit."

    def execute(self, args: dict[str, Any]) -> str:
        raise Limit


async def test_passthrough_exceptions_escape_for_the_worker() -> None:
    registry = ToolRegistry(passthrough=(Limit,))
    registry.register(HitsItsLimit())
    with pytest.raises(Limit):
        await registry.execute("slow", {})


async def test_a_tool_sees_context_changes_made_after_it_was_built() -> None:
    context = ToolContext(system_prompt="first")
    registry = registry_with(ContextReader(context))
    assert await registry.execute("whoami", {}) == "first"
    context.system_prompt = "second"
    assert await registry.execute("whoami", {}) == "second"


def test_a_context_with_a_source_reads_the_source_each_time() -> None:
    from worker.tools.context import ToolContextSnapshot

    state = {"prompt": "a"}
    context = ToolContext(source=lambda: ToolContextSnapshot(system_prompt=state["prompt"]))
    assert context.system_prompt == "a"
    state["prompt"] = "b"
    assert context.system_prompt == "b"
    assert context.snapshot().system_prompt == "b"


BLOCKING_CASES: list[tuple[str, Any]] = [
    ("echo", {"text": "ab", "times": 2}),
    ("async_echo", {"text": "ab"}),
    ("ping", "{}"),
    ("echo", {"text": 3}),
    ("echo", "not json"),
    ("fails", {}),
    ("weird", {}),
    ("missing", {}),
]


@pytest.mark.parametrize(("name", "args"), BLOCKING_CASES)
def test_run_blocking_answers_exactly_as_run_does(name: str, args: Any) -> None:
    """The worker's path (plain tools called directly, coroutines on a loop) changes nothing."""
    registry = registry_with(
        EchoTool(), AsyncEchoTool(), NoParamsTool(), FailingTool(), UnserialisableTool()
    )
    loop = asyncio.new_event_loop()
    try:
        blocking = registry.run_blocking(name, args, loop)
        awaited = loop.run_until_complete(registry.run(name, args))
    finally:
        loop.close()
    assert blocking == awaited


def test_run_blocking_lets_passthrough_exceptions_escape() -> None:
    registry = ToolRegistry(passthrough=(Limit,))
    registry.register(HitsItsLimit())
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(Limit):
            registry.run_blocking("slow", {}, loop)
    finally:
        loop.close()
