"""The fleet's tools for one run: proxies in a registry, switched on and off as the run asks.

The Agent offers them to a model; the MCP server offers them to MCP clients. Either way a call
goes through ``ToolRegistry.run``, which answers for unknown and disabled tools itself and hands
the rest to their pool through the queue.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from api.dispatch import Dispatcher
from api.fleet import Fleet
from api.remote_tool import RemoteTool
from worker.protocol import ToolContextSnapshot
from worker.tools.registry import ToolRegistry


class RunTools:
    """The model tools of ``fleet`` for run ``run_id``: on by default as the workers say, then
    ``enable`` and ``disable`` applied. ``context`` is read when a call is sent."""

    def __init__(
        self,
        fleet: Fleet,
        dispatcher: Dispatcher,
        run_id: str,
        context: Callable[[], ToolContextSnapshot],
        *,
        timeout_ms: int | None = None,
        enable: Iterable[str] = (),
        disable: Iterable[str] = (),
    ) -> None:
        self.run_id = run_id
        self.registry = ToolRegistry()
        self._fleet = fleet
        # Calls of two attempts at one run must not share task ids, or a rerun would be answered
        # with the first attempt's stored results.
        self._attempt = uuid.uuid4().hex[:8]
        self._call_seq = 0
        for spec in fleet.model_tools.values():
            proxy = RemoteTool.for_spec(spec)(
                dispatcher, run_id, context, self.next_task_id, timeout_ms
            )
            self.registry.register(proxy)
            if not spec.enabled_by_default:
                self.registry.disable(spec.name)
        for name in enable:
            self.enable(name)
        for name in disable:
            self.disable(name)

    def enable(self, name: str) -> None:
        """Switch a tool on; ``ValueError`` when no worker, or no live worker, serves it."""
        if not self.registry.has_tool(name):
            served = ", ".join(self.registry.get_tool_names())
            raise ValueError(f"Cannot enable {name!r}: no worker serves it (tools: {served})")
        tool = self.registry.get(name)
        if isinstance(tool, RemoteTool) and not self._fleet.serves(name):
            raise ValueError(
                f"Cannot enable {name!r}: no live worker serves its {tool.pool!r} pool"
            )
        self.registry.enable(name)

    def disable(self, name: str) -> None:
        """Switch a tool off; ``KeyError`` when there is no such tool."""
        self.registry.disable(name)

    def next_task_id(self) -> str:
        """The next call's id on the wire (its Celery task id), distinct per attempt."""
        self._call_seq += 1
        return f"{self.run_id}.{self._attempt}.{self._call_seq}"
