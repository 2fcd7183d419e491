"""The default tool set: the ten built-in tools, remove and run_bash registered but off."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from worker.capping import DEFAULT_OUTPUT_CAP_BYTES
from worker.sandbox import SandboxConfig
from worker.settings import get_worker_settings
from worker.tools.bash import RunBashTool
from worker.tools.context import ToolContext
from worker.tools.filesystem import (
    ListDirTool,
    MkdirTool,
    MoveTool,
    ReadFileTool,
    RemoveTool,
    WriteFileTool,
)
from worker.tools.registry import ToolRegistry
from worker.tools.search import SearchFilesTool, SearchTextTool
from worker.tools.session_context import SaveSessionContextTool
from worker.tools.workspace import Workspace


def create_default_tool_registry(
    context: ToolContext,
    workspace: Workspace | Path | str,
    *,
    output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES,
    sandbox: SandboxConfig | None = None,
    registry: ToolRegistry | None = None,
) -> ToolRegistry:
    """Register the built-in tools in ``registry`` (a new one by default) and return it.

    ``output_cap_bytes`` bounds every tool's answer, each of run_bash's streams included;
    ``sandbox`` (by default the worker's settings) says how run_bash isolates its commands.
    """
    ws = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
    registry = registry if registry is not None else ToolRegistry()
    cap = output_cap_bytes
    if sandbox is None:
        sandbox = SandboxConfig.from_settings(get_worker_settings())
    for tool in (
        ReadFileTool(ws, output_cap_bytes=cap),
        WriteFileTool(ws, output_cap_bytes=cap),
        SaveSessionContextTool(context, ws),
        ListDirTool(ws, output_cap_bytes=cap),
        MkdirTool(ws, output_cap_bytes=cap),
        RemoveTool(ws, output_cap_bytes=cap),
        MoveTool(ws, output_cap_bytes=cap),
        SearchTextTool(ws, output_cap_bytes=cap),
        SearchFilesTool(ws, output_cap_bytes=cap),
        RunBashTool(ws, replace(sandbox, output_cap_bytes=cap)),
    ):
        registry.register(tool)
        if not tool.enabled_by_default:
            registry.disable(tool.name)
    return registry
