"""A worker tool as the orchestrator's registry sees it: a proxy that sends the call to its pool,
through the fleet's ``Dispatcher`` or, in process, ``worker.in_process.LocalCalls``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, Unpack

from pydantic import BaseModel, ConfigDict

from worker.contract.deadlines import CallFields
from worker.contract.run_limits import RunLimits
from worker.contract.wire import ToolCallRequest, ToolCallResult, ToolContextSnapshot, ToolSpec
from worker.tools.interface import ProxyTool, ToolOutcome


class AnyArgs(BaseModel):
    """The worker validates against the real model; the proxy passes everything through."""

    model_config = ConfigDict(extra="allow")


class CallSender(Protocol):
    """Where a run's calls go: the fleet's workers (``api.calls.dispatch.Dispatcher``) or this
    process's own runner (``LocalCalls``); either answers as a worker does."""

    def build_request(self, spec: ToolSpec, **call: Unpack[CallFields]) -> ToolCallRequest: ...

    async def call(self, request: ToolCallRequest, pool: str) -> ToolCallResult: ...


class RemoteTool(ProxyTool):
    """A fleet tool in one run's registry, described by ``spec`` as its workers publish it, and
    run on the pool that serves it. ``context`` is read as each call is sent; ``new_task_id``
    gives each call its id on the wire."""

    Args = AnyArgs

    def __init__(
        self,
        spec: ToolSpec,
        dispatcher: CallSender,
        run_id: str,
        context: Callable[[], ToolContextSnapshot],
        new_task_id: Callable[[], str],
        timeout_ms: int | None = None,
        limits: RunLimits | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self.pool = spec.pool
        self.idempotent = spec.idempotent
        self.enabled_by_default = spec.enabled_by_default
        self.default_timeout_ms = spec.default_timeout_ms
        self.timeout_argument = spec.timeout_argument
        self.for_model = spec.for_model
        self.reads_context = spec.reads_context
        self._dispatcher = dispatcher
        self._run_id = run_id
        self._context = context
        self._new_task_id = new_task_id
        self._timeout_ms = timeout_ms
        #: The run's own limits, carried by each call (the worker applies them).
        self._limits = limits

    # A proxy's schema is its spec's, as its workers published it.
    def get_schema(self) -> dict[str, Any]:
        return self.spec.schema_for_model()

    async def forward(
        self, arguments: dict[str, Any] | str | None, tool_call_id: str | None
    ) -> ToolOutcome:
        """Send the arguments as the model gave them; the context is read now, at sending, for a
        tool that reads it (its spec's ``reads_context``)."""
        request = self._dispatcher.build_request(
            self.spec,
            task_id=self._new_task_id(),
            tool_call_id=tool_call_id,
            run_id=self._run_id,
            arguments=arguments if arguments is not None else {},
            context=self._context() if self.spec.reads_context else None,
            timeout_ms=self._timeout_ms,
        )
        if self._limits is not None:
            request = request.model_copy(update={"limits": self._limits})
        result = await self._dispatcher.call(request, self.spec.pool)
        return ToolOutcome(
            result.output,
            result.error_kind,
            worker=result.worker,
            duration_ms=result.duration_ms,
            truncated=result.truncated,
            usage=result.usage,
        )
