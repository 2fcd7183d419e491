"""A mock weather tool that is always sunny, served by every fleet: toolq's own plugin.

toolq names this module in its ``toolq.tools`` entry point (pyproject.toml), so every worker
loads it as it loads any plugin (``TOOLQ_DISABLED_TOOLS`` can switch it off): the worker imports
the module and calls its ``register`` hook with the worker's registry, context and workspace.
"""

from __future__ import annotations

import zlib
from typing import Any

from pydantic import Field

from worker.tools.context import ToolContext
from worker.tools.interface import ExecutableTool, ToolArgs
from worker.tools.paths import printable
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace

LOWEST_F = 65
HIGHEST_F = 75


class GetCurrentWeatherArgs(ToolArgs):
    location: str = Field(min_length=1, description="City and region, e.g. 'Boston, MA'.")


class GetCurrentWeatherTool(ExecutableTool):
    name = "get_current_weather"
    description = "Get the current weather for a location: the condition and the temperature in °F."
    Args = GetCurrentWeatherArgs
    idempotent = True
    reads_context = False

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        location: str = args["location"]
        # The same place always gets the same temperature, so a repeated call agrees.
        seed = zlib.crc32(location.encode("utf-8", "surrogatepass"))
        temperature = LOWEST_F + seed % (HIGHEST_F - LOWEST_F + 1)
        return {"location": printable(location), "condition": "Sunny", "temperature_f": temperature}


TOOLS: list[type[ExecutableTool]] = [GetCurrentWeatherTool]


def register(registry: ToolRegistry, context: ToolContext, workspace: Workspace) -> None:
    """The plugin hook: add this module's tools to ``registry``."""
    for tool in TOOLS:
        registry.register(tool())
