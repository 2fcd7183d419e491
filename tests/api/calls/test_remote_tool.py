"""RemoteTool: a fleet tool in the orchestrator's registry, forwarding each call to its pool."""

from __future__ import annotations

import itertools
import time

import pytest

from api.calls.dispatch import Dispatcher
from api.calls.remote_tool import RemoteTool
from tests.conftest import tool_spec
from worker.contract.settings import FleetSettings
from worker.contract.wire import ToolCallRequest, ToolCallResult, ToolContextSnapshot
from worker.tools.registry import ToolRegistry

RUN_BASH = tool_spec(
    "run_bash",
    "sandbox",
    description="Run a command.",
    parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    enabled_by_default=False,
    timeout_argument="timeout_ms",
)


class RecordingDispatcher(Dispatcher):
    """Builds requests as the real dispatcher does; instead of sending a call, keeps it and
    answers for worker w@host:7 (with a tool error when ``answer_error`` is set)."""

    def __init__(self) -> None:
        # Nothing listens there, and nothing is sent: building a request needs only settings.
        super().__init__(FleetSettings(broker_url="redis://127.0.0.1:1/0", max_timeout_ms=60_000))
        self.sent: list[tuple[ToolCallRequest, str]] = []
        self.answer_error = False

    async def call(self, request: ToolCallRequest, pool: str) -> ToolCallResult:
        self.sent.append((request, pool))
        if self.answer_error:
            return ToolCallResult.failure(request, "tool_error", "Error: it broke", "w@host:7")
        return ToolCallResult(
            task_id=request.task_id,
            tool=request.tool,
            output=f"ran {request.arguments}",
            duration_ms=12.5,
            worker="w@host:7",
        )


@pytest.fixture
def dispatcher() -> RecordingDispatcher:
    return RecordingDispatcher()


def remote(
    dispatcher: Dispatcher, snapshots: list[ToolContextSnapshot], timeout_ms: int | None = None
) -> RemoteTool:
    sequence = itertools.count(1)
    return RemoteTool(
        RUN_BASH,
        dispatcher,
        "run-1",
        lambda: snapshots[-1],
        lambda: f"run-1.attempt.{next(sequence)}",
        timeout_ms,
    )


async def test_each_call_goes_to_the_specs_pool_with_a_fresh_task_id_and_the_models_id(
    dispatcher: RecordingDispatcher,
) -> None:
    tool = remote(dispatcher, [ToolContextSnapshot(system_prompt="be brief")])

    await tool.forward('{"command": "ls"}', "call_a")
    await tool.forward({"command": "pwd"}, "call_b")

    [(first, first_pool), (second, second_pool)] = dispatcher.sent
    assert first_pool == second_pool == "sandbox"
    assert (first.task_id, second.task_id) == ("run-1.attempt.1", "run-1.attempt.2")
    assert (first.tool_call_id, second.tool_call_id) == ("call_a", "call_b")
    assert first.run_id == second.run_id == "run-1"
    assert first.tool == "run_bash"
    # The arguments travel as the model sent them: the worker validates them.
    assert first.arguments == '{"command": "ls"}'
    assert second.arguments == {"command": "pwd"}
    assert first.context.system_prompt == "be brief"
    assert first.timeout_ms == RUN_BASH.default_timeout_ms
    assert first.reply_to == dispatcher.reply_key
    assert first.deadline > time.time()


async def test_the_context_is_read_when_each_call_is_sent(
    dispatcher: RecordingDispatcher,
) -> None:
    snapshots = [ToolContextSnapshot(system_prompt="first")]
    tool = remote(dispatcher, snapshots)

    await tool.forward({"command": "ls"}, "call_a")
    snapshots.append(ToolContextSnapshot(system_prompt="second"))
    await tool.forward(None, None)

    [(first, _), (second, _)] = dispatcher.sent
    assert first.context.system_prompt == "first"
    assert second.context.system_prompt == "second"
    assert second.arguments == {}
    assert second.tool_call_id is None


async def test_the_agents_timeout_and_the_calls_own_timeout_set_the_limit(
    dispatcher: RecordingDispatcher,
) -> None:
    snapshots = [ToolContextSnapshot()]

    await remote(dispatcher, snapshots, timeout_ms=1_500).forward({"command": "ls"}, "a")
    await remote(dispatcher, snapshots).forward({"command": "ls", "timeout_ms": 9_000}, "b")

    [(overridden, _), (own, _)] = dispatcher.sent
    assert overridden.timeout_ms == 1_500
    assert own.timeout_ms == 10_000  # the call's own limit, plus time to report


async def test_the_result_becomes_an_outcome_with_its_worker_and_duration(
    dispatcher: RecordingDispatcher,
) -> None:
    tool = remote(dispatcher, [ToolContextSnapshot()])

    ok = await tool.forward({"command": "ls"}, "call_a")
    dispatcher.answer_error = True
    failed = await tool.forward({"command": "ls"}, "call_b")

    assert ok.output == "ran {'command': 'ls'}"
    assert not ok.is_error
    assert (ok.worker, ok.duration_ms) == ("w@host:7", 12.5)
    assert failed.output == "Error: it broke"
    assert failed.error_kind == "tool_error"
    assert failed.is_error
    assert failed.worker == "w@host:7"


async def test_the_registry_hands_the_call_over_as_the_model_made_it(
    dispatcher: RecordingDispatcher,
) -> None:
    registry = ToolRegistry()
    registry.register(remote(dispatcher, [ToolContextSnapshot()]))
    registry.enable("run_bash")

    outcome = await registry.run("run_bash", '{"command": ', tool_call_id="call_z")

    [(request, _)] = dispatcher.sent
    assert request.arguments == '{"command": '  # not JSON: for the worker to refuse
    assert request.tool_call_id == "call_z"
    assert outcome.worker == "w@host:7"


def test_a_remote_tool_is_described_by_its_spec(dispatcher: RecordingDispatcher) -> None:
    tool = remote(dispatcher, [ToolContextSnapshot()])

    assert tool.spec == RUN_BASH
    assert tool.name == "run_bash"
    assert tool.description == "Run a command."
    assert tool.pool == "sandbox"
    assert tool.idempotent is False
    assert tool.enabled_by_default is False
    assert tool.timeout_argument == "timeout_ms"
    assert tool.default_timeout_ms == RUN_BASH.default_timeout_ms
    assert tool.get_schema() == RUN_BASH.schema_for_model()


def test_every_fleet_tool_is_an_instance_of_one_class(dispatcher: RecordingDispatcher) -> None:
    weather = tool_spec("get_current_weather", "tools", description="The weather.")
    context = ToolContextSnapshot()
    bash = remote(dispatcher, [context])
    other = RemoteTool(weather, dispatcher, "run-2", lambda: context, lambda: "run-2.a.1")

    assert type(bash) is type(other) is RemoteTool
    assert (bash.name, other.name) == ("run_bash", "get_current_weather")
    assert (bash.pool, other.pool) == ("sandbox", "tools")
    assert other.get_schema() == weather.schema_for_model()


async def test_a_tool_that_never_reads_the_conversation_is_sent_none(
    dispatcher: RecordingDispatcher,
) -> None:
    conversation = ToolContextSnapshot(
        system_prompt="be brief",
        session_context=[{"role": "user", "content": "a long conversation " * 1000}],
    )
    blind = RUN_BASH.model_copy(update={"reads_context": False})
    tool = RemoteTool(blind, dispatcher, "run-1", lambda: conversation, lambda: "t-1")

    await tool.forward({"command": "ls"}, "call_a")

    [(request, _)] = dispatcher.sent
    assert request.context == ToolContextSnapshot()
    assert "a long conversation" not in request.model_dump_json()
