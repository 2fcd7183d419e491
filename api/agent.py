"""The Agent: a conversation on an OpenAI-compatible model whose tool calls run on the workers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

from openai import AsyncOpenAI
from pydantic import BaseModel, ConfigDict, Field

from api.dispatch import Dispatcher
from api.events import (
    AgentEvent,
    FinalAnswer,
    TextDelta,
    TextDiscarded,
    ToolCallFinished,
    ToolCallStarted,
)
from api.fleet import Fleet, load_fleet
from api.llm import (
    ChatModel,
    ModelTurn,
    RetryPolicy,
    StreamRestarted,
    ToolCallSpec,
    TurnDone,
    Usage,
)
from api.remote_tool import RemoteTool
from api.settings import OrchestratorSettings, get_settings
from worker.protocol import RUN_ID_PATTERN
from worker.tools.context import Message, ToolContext, ToolContextSnapshot
from worker.tools.interface import ExecutableTool
from worker.tools.registry import ToolRegistry

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. You can use tools that work on files in your workspace; "
    "call them when they help, several at once when they are independent."
)
ORCHESTRATOR = "orchestrator"


class AgentOptions(BaseModel):
    """How a conversation runs. Unknown options are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    model: str | None = Field(None, description="Model name; TOOLQ_MODEL when unset.")
    session_context_file_path: str = "session_context.json"
    max_turns: int | None = Field(None, gt=0, le=1000, description="TOOLQ_MAX_TURNS when unset.")
    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN, description="Names the workspace.")
    enable: list[str] = Field(default_factory=list, description="Tools to switch on.")
    disable: list[str] = Field(default_factory=list, description="Tools to switch off.")
    tool_timeout_ms: int | None = Field(None, gt=0, description="Per-call deadline override.")


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call of the conversation, with where and how long it ran."""

    id: str
    name: str
    arguments: str
    output: str
    is_error: bool
    error_kind: str | None
    duration_ms: float
    wall_ms: float
    worker: str | None
    turn: int
    #: The pool that ran the call; None when the orchestrator ran it (a local tool).
    pool: str | None = None
    #: What the call's command used (run_bash), as its worker measured it: the fields of
    #: ``worker.protocol.ResourceUsage``. The tool's JSON answer in ``output`` has it too.
    usage: dict[str, Any] | None = None


class Agent:
    """``await Agent(provider, options).chat("...")`` runs a conversation to its answer.

    ``provider`` is an ``openai.AsyncOpenAI`` (or a ``ChatModel`` around one). The agent's tools
    are the fleet's, as proxies in its own ``ToolRegistry``, plus any local tool added with
    ``add_tool``. Failures of tools reach the model as tool messages; only a model API that keeps
    failing after its retries ends the conversation with ``ModelError``.
    """

    def __init__(
        self,
        provider: AsyncOpenAI | ChatModel,
        options: AgentOptions | None = None,
        *,
        dispatcher: Dispatcher | None = None,
        fleet: Fleet | None = None,
        settings: OrchestratorSettings | None = None,
    ) -> None:
        self._settings = settings or get_settings()
        self.options = options or AgentOptions()
        self._llm = (
            provider
            if isinstance(provider, ChatModel)
            else ChatModel(provider, RetryPolicy.from_settings(self._settings))
        )
        self.run_id = self.options.run_id or f"run-{uuid.uuid4().hex[:16]}"
        self._owns_dispatcher = dispatcher is None
        self._dispatcher = dispatcher or Dispatcher(self._settings)
        # Calls of two attempts at one run must not share task ids, or a rerun would be answered
        # with the first attempt's stored results.
        self._attempt = uuid.uuid4().hex[:8]
        self._call_seq = 0
        self._system_prompt = self.options.system_prompt
        self.messages: list[Message] = []
        self.usage = Usage()
        self.tool_calls: list[ToolCallRecord] = []
        self.stop_reason: str | None = None
        self.observers: list[Callable[[AgentEvent], None]] = []
        self.registry = ToolRegistry()
        self._fleet = (fleet or load_fleet(self._settings.redis_url)).require_tools()
        for spec in self._fleet.tools.values():
            proxy = RemoteTool.for_spec(spec)(
                self._dispatcher,
                self.run_id,
                self._snapshot,
                self._next_task_id,
                self.options.tool_timeout_ms,
            )
            self.registry.register(proxy)
            if not spec.enabled_by_default:
                self.registry.disable(spec.name)
        for name in self.options.enable:
            self.enable_tool(name)
        for name in self.options.disable:
            self.disable_tool(name)

    # -- tools ---------------------------------------------------------------------------------

    @property
    def context(self) -> ToolContext:
        """A live view of this conversation's state, for local tools."""
        return ToolContext(source=self._snapshot)

    def get_tools(self) -> list[dict[str, Any]]:
        return self.registry.get_enabled_schemas()

    def add_tool(self, tool: ExecutableTool) -> None:
        """A tool of the caller's that runs here, in the orchestrator process."""
        self.registry.register(tool)

    def remove_tool(self, name: str) -> None:
        self.registry.unregister(name)

    def enable_tool(self, name: str) -> None:
        if not self.registry.has_tool(name):
            served = ", ".join(self.registry.get_tool_names())
            raise ValueError(f"Cannot enable {name!r}: no worker serves it (tools: {served})")
        tool = self.registry.get(name)
        if isinstance(tool, RemoteTool) and not self._fleet.serves(name):
            raise ValueError(
                f"Cannot enable {name!r}: no live worker serves its {tool.pool!r} pool"
            )
        self.registry.enable(name)

    def disable_tool(self, name: str) -> None:
        self.registry.disable(name)

    # -- state ---------------------------------------------------------------------------------

    def clear_context(self) -> None:
        self.messages = []

    def set_system_prompt(self, text: str) -> None:
        self._system_prompt = text

    @property
    def system_prompt(self) -> str:
        return self._system_prompt

    async def save_context(self, reason: str) -> str:
        return await self.registry.execute("save_session_context", {"reason": reason})

    async def close(self) -> None:
        if self._owns_dispatcher:
            await self._dispatcher.close()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- conversation --------------------------------------------------------------------------

    async def chat(self, message: str) -> str:
        """Run the conversation until the model answers or the turn limit stops it."""
        answer = ""
        async for event in self._converse(message, stream=False):
            if isinstance(event, FinalAnswer):
                answer = event.text
        return answer

    def stream_chat(self, message: str) -> AsyncIterator[AgentEvent]:
        """The same conversation as events: text deltas, tool calls, the final answer."""
        return self._converse(message, stream=True)

    async def _converse(self, message: str, *, stream: bool) -> AsyncIterator[AgentEvent]:
        self.messages.append({"role": "user", "content": message})
        self.stop_reason = None
        for turn in range(1, self.max_turns + 1):
            model_turn: ModelTurn | None = None
            if stream:
                async for item in self._llm.stream(
                    model=self._model_name, messages=self._wire_messages(), tools=self._tools()
                ):
                    if isinstance(item, TurnDone):
                        model_turn = item.turn
                    elif isinstance(item, StreamRestarted):
                        yield self._emit(TextDiscarded(item.reason))
                    else:
                        yield self._emit(TextDelta(item.text))
            else:
                model_turn = await self._llm.complete(
                    model=self._model_name, messages=self._wire_messages(), tools=self._tools()
                )
            assert model_turn is not None
            self.usage = self.usage + model_turn.usage
            self.messages.append(model_turn.assistant_message())
            if not model_turn.tool_calls:
                self.stop_reason = "answered"
                yield self._emit(FinalAnswer(model_turn.content or "", "answered"))
                return
            async for event in self._run_tool_calls(model_turn.tool_calls, turn):
                yield event
        self.stop_reason = "max_turns"
        yield self._emit(
            FinalAnswer(
                f"Stopped: the turn limit of {self.max_turns} model turns was reached "
                "before the model gave a final answer.",
                "max_turns",
            )
        )

    async def _run_tool_calls(
        self, calls: list[ToolCallSpec], turn: int
    ) -> AsyncIterator[AgentEvent]:
        """All calls of a turn at once; tool messages go back in the order the model gave."""
        for call in calls:
            yield self._emit(ToolCallStarted(call.id, call.name, call.arguments))
        tasks = [asyncio.ensure_future(self._run_one(call, turn)) for call in calls]
        for finished in asyncio.as_completed(tasks):
            record = await finished
            yield self._emit(
                ToolCallFinished(
                    record.id,
                    record.name,
                    record.output,
                    record.is_error,
                    record.error_kind,
                    record.duration_ms,
                    record.worker,
                    record.pool,
                    record.usage,
                )
            )
        for call, task in zip(calls, tasks, strict=True):
            record = task.result()
            self.tool_calls.append(record)
            self.messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": record.output}
            )

    async def _run_one(self, call: ToolCallSpec, turn: int) -> ToolCallRecord:
        # Fleet tools, local tools, unknown and disabled ones: the registry answers for all.
        started = time.perf_counter()
        outcome = await self.registry.run(call.name, call.arguments, tool_call_id=call.id)
        wall_ms = round((time.perf_counter() - started) * 1000, 3)
        tool = self.registry.get(call.name)
        return ToolCallRecord(
            id=call.id,
            name=call.name,
            arguments=call.arguments,
            output=outcome.output,
            is_error=outcome.is_error,
            error_kind=outcome.error_kind,
            duration_ms=wall_ms if outcome.duration_ms is None else outcome.duration_ms,
            wall_ms=wall_ms,
            worker=outcome.worker or ORCHESTRATOR,
            turn=turn,
            pool=tool.pool if isinstance(tool, RemoteTool) else None,
            usage=None if outcome.usage is None else outcome.usage.model_dump(),
        )

    def transcript(self) -> dict[str, Any]:
        """The whole conversation as plain data: for --json, batch output and the HTTP API."""
        return {
            "run_id": self.run_id,
            "model": self._model_name,
            "stop_reason": self.stop_reason,
            "messages": self._wire_messages(),
            "tool_calls": [asdict(record) for record in self.tool_calls],
            "usage": asdict(self.usage),
        }

    # -- helpers -------------------------------------------------------------------------------

    @property
    def max_turns(self) -> int:
        return self.options.max_turns or self._settings.max_turns

    @property
    def _model_name(self) -> str:
        return self.options.model or self._settings.model

    def _tools(self) -> list[dict[str, Any]] | None:
        return self.get_tools() or None

    def _wire_messages(self) -> list[Message]:
        return [{"role": "system", "content": self._system_prompt}, *self.messages]

    def _snapshot(self) -> ToolContextSnapshot:
        return ToolContextSnapshot(
            system_prompt=self._system_prompt,
            session_context=[dict(m) for m in self.messages],
            session_context_file_path=self.options.session_context_file_path,
        )

    def _next_task_id(self) -> str:
        """The next call's id on the wire (its Celery task id), distinct per attempt."""
        self._call_seq += 1
        return f"{self.run_id}.{self._attempt}.{self._call_seq}"

    def _emit(self, event: AgentEvent) -> AgentEvent:
        for observer in self.observers:
            observer(event)
        return event
