"""The fleet's tools for one run: proxies in a registry, switched on and off as the run asks.

The Agent offers them to a model; the MCP server offers them to MCP clients. Either way a call
goes through ``ToolRegistry.run``, which answers for unknown and disabled tools itself and hands
the rest to their pool through the queue.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from api.calls.fleet import Fleet
from api.calls.remote_tool import CallSender, RemoteTool
from worker.contract.run_limits import RunLimits
from worker.contract.wire import ToolContextSnapshot, ToolSpec
from worker.tools.registry import ToolRegistry


class RunTools:
    """The model tools ``specs`` for run ``run_id``, sent through ``sender``: on by default as
    the workers say, then ``enable`` and ``disable`` applied. ``context`` is read when a call is
    sent. ``fleet``: the fleet whose workers serve them; None when they run in this process."""

    def __init__(
        self,
        sender: CallSender,
        specs: Iterable[ToolSpec],
        run_id: str,
        context: Callable[[], ToolContextSnapshot],
        *,
        fleet: Fleet | None = None,
        timeout_ms: int | None = None,
        limits: RunLimits | None = None,
        enable: Iterable[str] = (),
        disable: Iterable[str] = (),
        registry: ToolRegistry | None = None,
    ) -> None:
        self.run_id = run_id
        #: The run's tools: the fleet's proxies, beside whatever ``registry`` held already.
        self.registry = registry if registry is not None else ToolRegistry()
        # Calls of two attempts at one run must not share task ids, or a rerun would be answered
        # with the first attempt's stored results.
        self._attempt = uuid.uuid4().hex[:8]
        self._call_seq = 0
        for spec in specs:
            if not spec.for_model:
                continue
            self.registry.register(
                RemoteTool(spec, sender, run_id, context, self.next_task_id, timeout_ms, limits)
            )
            if not spec.enabled_by_default:
                self.registry.disable(spec.name)
        for name in enable:
            enable_tool(self.registry, fleet, name)
        for name in disable:
            self.registry.disable(name)

    def next_task_id(self) -> str:
        """The next call's id on the wire (its Celery task id), distinct per attempt."""
        self._call_seq += 1
        return f"{self.run_id}.{self._attempt}.{self._call_seq}"


def enable_tool(registry: ToolRegistry, fleet: Fleet | None, name: str) -> None:
    """Switch ``name`` on in ``registry``; ``ValueError`` when there is no such tool, or when
    ``fleet`` (None: the tools run in this process) has no live worker for its pool."""
    if not registry.has_tool(name):
        served = ", ".join(registry.get_tool_names())
        why = "no worker serves it" if fleet is not None else "there is no such tool"
        raise ValueError(f"Cannot enable {name!r}: {why} (tools: {served})")
    tool = registry.get(name)
    if isinstance(tool, RemoteTool) and fleet is not None and not fleet.serves(name):
        raise ValueError(f"Cannot enable {name!r}: no live worker serves its {tool.pool!r} pool")
    registry.enable(name)
