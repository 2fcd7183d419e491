"""A worker tool as the orchestrator's registry sees it: a proxy that sends the call to its pool."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from api.dispatch import Dispatcher
from worker.contract.wire import ToolContextSnapshot, ToolSpec
from worker.tools.interface import ProxyTool, ToolOutcome


class AnyArgs(BaseModel):
    """The worker validates against the real model; the proxy passes everything through."""

    model_config = ConfigDict(extra="allow")


class RemoteTool(ProxyTool):
    """Runs on the pool that serves it. Build one with ``RemoteTool.for_spec``."""

    spec: ClassVar[ToolSpec]
    Args = AnyArgs

    def __init__(
        self,
        dispatcher: Dispatcher,
        run_id: str,
        context: Callable[[], ToolContextSnapshot],
        new_task_id: Callable[[], str],
        timeout_ms: int | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._run_id = run_id
        self._context = context
        self._new_task_id = new_task_id
        self._timeout_ms = timeout_ms

    @classmethod
    def for_spec(cls, spec: ToolSpec) -> type[RemoteTool]:
        """The proxy class of ``spec``, made once for each distinct spec: the runs of a batch,
        each with a registry of its own, share their fleet's, and a class costs more to make,
        and to collect, than a call."""
        return _proxy_class(cls, spec.model_dump_json())

    @classmethod
    def get_schema(cls) -> dict[str, Any]:
        return cls.spec.schema_for_model()

    async def forward(
        self, arguments: dict[str, Any] | str | None, tool_call_id: str | None
    ) -> ToolOutcome:
        """Send the arguments as the model gave them; the context is read now, at sending."""
        request = self._dispatcher.build_request(
            self.spec,
            task_id=self._new_task_id(),
            tool_call_id=tool_call_id,
            run_id=self._run_id,
            arguments=arguments if arguments is not None else {},
            context=self._context(),
            timeout_ms=self._timeout_ms,
        )
        result = await self._dispatcher.call(request, self.spec.pool)
        return ToolOutcome(
            result.output,
            result.error_kind,
            worker=result.worker,
            duration_ms=result.duration_ms,
            truncated=result.truncated,
            usage=result.usage,
        )


@functools.lru_cache(maxsize=1024)
def _proxy_class(base: type[RemoteTool], spec_json: str) -> type[RemoteTool]:
    spec = ToolSpec.model_validate_json(spec_json)
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
    return type(f"Remote_{spec.name}", (base,), attrs)
