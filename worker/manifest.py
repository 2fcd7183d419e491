"""What a worker serves: the specs of its tools, which its heartbeat publishes to the fleet."""

from __future__ import annotations

from collections.abc import Iterable

from worker.contract.settings import WorkerSettings
from worker.contract.wire import POOLS, Pool, ToolSpec
from worker.tools.registry import ToolRegistry


def fleet_tool_specs(settings: WorkerSettings, pools: Iterable[Pool] = POOLS) -> list[ToolSpec]:
    """Every tool a worker of ``pools`` with these settings has, in registration order."""
    from worker.call_runner import build_registry

    return tool_specs(build_registry(settings, pools=pools), settings)


def tool_specs(registry: ToolRegistry, settings: WorkerSettings) -> list[ToolSpec]:
    """The specs of the tools of ``registry``, built with ``settings``, in registration order."""
    specs = []
    for position, name in enumerate(registry.get_tool_names()):
        tool = registry.get(name)
        assert tool is not None
        own = tool.default_timeout_ms
        default_timeout_ms = settings.default_timeout_ms if own is None else own
        specs.append(
            ToolSpec(
                name=name,
                description=tool.description,
                parameters=tool.get_schema()["function"]["parameters"],
                pool=tool.pool,
                enabled_by_default=tool.enabled_by_default and name not in settings.disabled_tools,
                idempotent=tool.idempotent,
                default_timeout_ms=min(default_timeout_ms, settings.max_timeout_ms),
                timeout_argument=tool.timeout_argument,
                position=position,
                for_model=tool.for_model,
                reads_context=tool.reads_context,
            )
        )
    return specs
