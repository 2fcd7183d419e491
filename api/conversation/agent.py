"""The Agent: a conversation on an OpenAI-compatible model whose tool calls run on the workers.

``AgentOptions`` and ``ToolCallRecord`` (``api.conversation.agent_options``) are importable from
here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import asdict
from typing import Any, cast

from openai import AsyncOpenAI

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.conversation.agent_options import (
    DEFAULT_SYSTEM_PROMPT,
    ORCHESTRATOR,
    AgentOptions,
    ToolCallRecord,
    stopped_call,
)
from api.conversation.events import (
    AgentEvent,
    FinalAnswer,
    StopReason,
    TextDelta,
    TextDiscarded,
    ToolCallStarted,
)
from api.conversation.limits import ConversationLimits, LimitReached
from api.conversation.placement import ConversationTools, place
from api.model.client import (
    ChatModel,
    ModelToolCall,
    ModelTurn,
    RetryPolicy,
    StreamEvent,
    StreamRestarted,
    TurnDone,
    Usage,
)
from api.process.logs import log_context
from api.runs.environment import RunEnvironment
from api.settings import OrchestratorSettings, get_settings
from worker.contract.deadlines import call_limit_ms
from worker.contract.network import NetworkChoice
from worker.contract.settings import WorkerSettings
from worker.tools.context import Message, ToolContextSnapshot
from worker.tools.functions import as_tool
from worker.tools.interface import ExecutableTool, ProxyTool
from worker.tools.registry import ToolRegistry

__all__ = ["DEFAULT_SYSTEM_PROMPT", "Agent", "AgentOptions", "ToolCallRecord"]


class Agent:
    """``await Agent(provider, options).chat("...")`` runs a conversation to its answer.

    ``provider`` is an ``openai.AsyncOpenAI`` (or a ``ChatModel`` around one). The agent's tools
    are the fleet's, as proxies in its own ``ToolRegistry``, plus any local tool added with
    ``add_tool``. With no broker configured (``TOOLQ_BROKER_URL``) and no ``dispatcher`` or
    ``fleet`` given, the agent starts a local stack of its own, as ``toolq run`` does, and
    ``close`` stops it. ``in_process=True`` runs the fleet's tools in this process instead: no
    Redis, no workers. ``worker_settings`` (``TOOLQ_*`` by default) configure either.

    Failures of tools reach the model as tool messages; only a model API that keeps failing
    after its retries ends the conversation with ``ModelError``.
    """

    def __init__(
        self,
        provider: AsyncOpenAI | ChatModel,
        options: AgentOptions | None = None,
        *,
        dispatcher: Dispatcher | None = None,
        fleet: Fleet | None = None,
        settings: OrchestratorSettings | None = None,
        in_process: bool = False,
        worker_settings: WorkerSettings | None = None,
        image: str | None = None,
        network: NetworkChoice | None = None,
    ) -> None:
        settings = settings or get_settings()
        self.options = options or AgentOptions()
        if image is not None:
            self.options = self.options.model_copy(update={"image": image})
        if network is not None:  # checked as the options check it
            self.options = AgentOptions.model_validate(
                {**self.options.model_dump(exclude_unset=True), "network": network}
            )
        self._llm = (
            provider
            if isinstance(provider, ChatModel)
            else ChatModel(provider, RetryPolicy.from_settings(settings))
        )
        self.run_id = self.options.run_id or f"run-{uuid.uuid4().hex[:16]}"
        self._system_prompt = self.options.system_prompt
        self.messages: list[Message] = []
        self.usage = Usage()
        self.tool_calls: list[ToolCallRecord] = []
        self.stop_reason: StopReason | None = None
        self.limits = ConversationLimits(self.options.time_limit_s, self.options.token_limit)
        self.observers: list[Callable[[AgentEvent], None]] = []
        self.registry = ToolRegistry()
        placement = place(
            settings,
            fleet_given=dispatcher is not None or fleet is not None,
            in_process=in_process,
        )
        self._placed_tools = ConversationTools(
            placement,
            self.registry,
            self.run_id,
            self.options,
            self._snapshot,
            settings=settings,
            dispatcher=dispatcher,
            fleet=fleet,
            worker_settings=worker_settings,
        )
        self._settings = self._placed_tools.settings

    @property
    def environment(self) -> RunEnvironment | None:
        """With an image: the run's container."""
        return self._placed_tools.environment

    # -- tools ---------------------------------------------------------------------------------

    def get_tools(self) -> list[dict[str, Any]]:
        """The schemas of the tools switched on, as the model is given them (OpenAI's
        ``{"type": "function", "function": {...}}``)."""
        return self.registry.get_enabled_schemas()

    def add_tool(self, tool: ExecutableTool | Callable[..., Any]) -> ExecutableTool:
        """A tool of the caller's that runs here, in the orchestrator process, under the same
        deadlines as a worker's: a tool, or a plain function made one (see
        ``worker.tools.functions.tool``)."""
        made = as_tool(tool)
        self.registry.register(made)
        return made

    def remove_tool(self, name: str) -> None:
        """Take a tool out of this agent's registry (nothing when it has none such): the model
        is no longer offered it, and a call of it is answered as an unknown tool's."""
        self.registry.unregister(name)

    def enable_tool(self, name: str) -> None:
        """Switch a tool on for the next model turn (``run_bash`` and ``remove`` are off by
        default); ``ValueError`` when there is none such, or no live worker serves it."""
        self._placed_tools.enable(name)

    def disable_tool(self, name: str) -> None:
        """Switch a tool off: the model is no longer offered it, and a call of it is refused as
        a disabled tool's; ``KeyError`` when there is none such."""
        self.registry.disable(name)

    # -- state ---------------------------------------------------------------------------------

    def clear_context(self) -> None:
        """Forget the conversation's messages: the next ``chat`` starts afresh, in the same
        run and workspace, with the same tools, usage and tool call records."""
        self.messages = []

    def set_system_prompt(self, text: str) -> None:
        """The system message of the model's next requests (the conversation's messages
        stay)."""
        self._system_prompt = text

    @property
    def system_prompt(self) -> str:
        """The system message the model is sent first."""
        return self._system_prompt

    async def save_context(self, reason: str) -> str:
        """Save the system prompt and the conversation so far, with ``reason``, as JSON in the
        workspace (``options.session_context_file_path``), through the ``save_session_context``
        tool; its answer, which says where (or why it could not), is returned."""
        return await self.registry.execute("save_session_context", {"reason": reason})

    async def close(self) -> None:
        """End the run's container, close the fleet's connection, stop the agent's local stack."""
        await self._placed_tools.close()

    async def __aenter__(self) -> Agent:
        """``async with Agent(...) as agent:`` closes it at the end (``close``)."""
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- conversation --------------------------------------------------------------------------

    async def chat(self, message: str) -> str:
        """Run the conversation until the model answers or a turn, time or token limit stops it."""
        answer = ""
        async for event in self._converse(message, stream=False):
            if isinstance(event, FinalAnswer):
                answer = event.text
        return answer

    def stream_chat(self, message: str) -> AsyncIterator[AgentEvent]:
        """The same conversation as events: text deltas, tool calls, the final answer."""
        return self._converse(message, stream=True)

    async def _converse(self, message: str, *, stream: bool) -> AsyncIterator[AgentEvent]:
        if self.environment is not None:  # ImageUnavailable: one line naming the image
            await self.environment.ensure_started()
        self.messages.append({"role": "user", "content": message})
        self.stop_reason = None
        self.limits.start()
        try:
            for turn in range(1, self.max_turns + 1):
                self.limits.check_tokens(self.usage.total_tokens)
                model_turn: ModelTurn | None = None
                if stream:
                    async for piece in self._streamed_turn():
                        if isinstance(piece, ModelTurn):
                            model_turn = piece
                        else:
                            yield piece
                else:
                    model_turn = await self.limits.within(
                        self._llm.complete(
                            model=self._model_name,
                            messages=self._wire_messages(),
                            tools=self._tools(),
                        ),
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
        except LimitReached as reached:
            self.stop_reason = reached.reason
            yield self._emit(FinalAnswer(reached.message, reached.reason))
            return
        self.stop_reason = "max_turns"
        yield self._emit(
            FinalAnswer(
                f"Stopped: the turn limit of {self.max_turns} model turns was reached "
                "before the model gave a final answer.",
                "max_turns",
            )
        )

    async def _streamed_turn(self) -> AsyncIterator[AgentEvent | ModelTurn]:
        """One model turn as it streams: its events, then the whole turn."""
        stream = self._llm.stream(
            model=self._model_name, messages=self._wire_messages(), tools=self._tools()
        )
        async with contextlib.aclosing(cast(AsyncGenerator[StreamEvent, None], stream)) as pieces:
            while (piece := await self.limits.within(anext(pieces, None))) is not None:
                if isinstance(piece, TurnDone):
                    yield piece.turn
                elif isinstance(piece, StreamRestarted):
                    yield self._emit(TextDiscarded(piece.reason))
                else:
                    yield self._emit(TextDelta(piece.text))

    async def _run_tool_calls(
        self, calls: list[ModelToolCall], turn: int
    ) -> AsyncIterator[AgentEvent]:
        """All calls of a turn at once; tool messages go back in the order the model gave.

        When the time limit passes first, the calls still running are cancelled and answered
        as stopped, so the transcript still pairs every call with its answer.
        """
        for call in calls:
            yield self._emit(ToolCallStarted(call.id, call.name, call.arguments))
        tasks = [asyncio.ensure_future(self._run_one(call, turn)) for call in calls]
        stopped: LimitReached | None = None
        try:
            for finished in asyncio.as_completed(tasks):
                record = await self.limits.within(finished)
                yield self._emit(record.finished_event())
        except LimitReached as reached:
            stopped = reached
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for call, task in zip(calls, tasks, strict=True):
            record = task.result() if not task.cancelled() else stopped_call(call, turn)
            self.tool_calls.append(record)
            self.messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": record.output}
            )
        if stopped is not None:
            raise stopped

    async def _run_one(self, call: ModelToolCall, turn: int) -> ToolCallRecord:
        # Fleet tools, local tools, unknown and disabled ones: the registry answers for all.
        tool = self.registry.get(call.name)
        started = time.perf_counter()
        with log_context(run_id=self.run_id, tool_call_id=call.id):
            outcome = await self.registry.run(
                call.name,
                call.arguments,
                tool_call_id=call.id,
                timeout_ms=self._local_limit_ms(tool, call.arguments),
            )
        wall_ms = round((time.perf_counter() - started) * 1000, 3)
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
            pool=tool.pool if isinstance(tool, ProxyTool) else None,
            usage=None if outcome.usage is None else outcome.usage.model_dump(),
            truncated=outcome.truncated,
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
            **({"image": self.environment.record()} if self.environment is not None else {}),
        }

    # -- helpers -------------------------------------------------------------------------------

    @property
    def max_turns(self) -> int:
        """Model turns a ``chat`` may take: ``options.max_turns``, else ``TOOLQ_MAX_TURNS``."""
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

    def _local_limit_ms(self, tool: ExecutableTool | None, arguments: str) -> int | None:
        """The deadline of a tool that runs here; a worker's tools carry theirs to the worker."""
        if tool is None or isinstance(tool, ProxyTool):
            return None
        return call_limit_ms(
            self._settings,
            override=self.options.tool_timeout_ms,
            timeout_argument=tool.timeout_argument,
            arguments=arguments,
            tool_default_ms=tool.default_timeout_ms,
        )

    def _emit(self, event: AgentEvent) -> AgentEvent:
        for observer in self.observers:
            observer(event)
        return event
