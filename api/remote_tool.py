"""A worker tool as the orchestrator's registry sees it: a proxy whose execute dispatches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from api.dispatch import Dispatcher
from worker.manifest import ToolSpec
from worker.protocol import ToolCallResult
from worker.tools.context import ToolContextSnapshot
from worker.tools.interface import ExecutableTool


class AnyArgs(BaseModel):
    """The worker validates against the real model; the proxy passes everything through."""

    model_config = ConfigDict(extra="allow")


class RemoteTool(ExecutableTool):
    """Runs on the pool that serves it. Build one with ``RemoteTool.for_spec``."""

    spec: ClassVar[ToolSpec]
    Args = AnyArgs

    def __init__(
        self,
        dispatcher: Dispatcher,
        run_id: str,
        context: Callable[[], ToolContextSnapshot],
        new_call_id: Callable[[], str],
    ) -> None:
        self._dispatcher = dispatcher
        self._run_id = run_id
        self._context = context
        self._new_call_id = new_call_id

    @classmethod
    def for_spec(cls, spec: ToolSpec) -> type[RemoteTool]:
        attrs: dict[str, Any] = {
            "spec": spec,
            "name": spec.name,
            "description": spec.description,
            "pool": spec.pool,
            "idempotent": spec.idempotent,
            "enabled_by_default": spec.enabled_by_default,
            "default_timeout_ms": spec.default_timeout_ms,
            "timeout_argument": spec.timeout_argument,
        }
        return type(f"Remote_{spec.name}", (cls,), attrs)

    @classmethod
    def get_schema(cls) -> dict[str, Any]:
        return cls.spec.schema_for_model()

    async def call(
        self,
        tool_call_id: str,
        arguments: str | dict[str, Any],
        timeout_ms: int | None = None,
    ) -> ToolCallResult:
        """Send the arguments as the model gave them; the context is read now, at sending."""
        request = self._dispatcher.build_request(
            self.spec,
            tool_call_id=tool_call_id,
            run_id=self._run_id,
            arguments=arguments,
            context=self._context(),
            timeout_ms=timeout_ms,
        )
        return await self._dispatcher.call(request, self.spec.pool)

    async def execute(self, args: dict[str, Any]) -> str:
        result = await self.call(self._new_call_id(), args)
        if result.is_error:
            raise RemoteToolError(result.output)
        return result.output


class RemoteToolError(Exception):
    """A worker answered with an error; its text is already meant for the model."""

    def __str__(self) -> str:
        text = super().__str__()
        return text.removeprefix("Error: ")
