"""The default tool set: the ten built-in tools, remove and run_bash registered but off."""

from __future__ import annotations

from pathlib import Path

from worker.sandbox import SandboxConfig
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
    sandbox: SandboxConfig | None = None,
    registry: ToolRegistry | None = None,
) -> ToolRegistry:
    """Register the built-in tools in ``registry`` (a new one by default) and return it."""
    ws = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
    registry = registry if registry is not None else ToolRegistry()
    for tool in (
        ReadFileTool(ws),
        WriteFileTool(ws),
        SaveSessionContextTool(context, ws),
        ListDirTool(ws),
        MkdirTool(ws),
        RemoveTool(ws),
        MoveTool(ws),
        SearchTextTool(ws),
        SearchFilesTool(ws),
        RunBashTool(ws, sandbox),
    ):
        registry.register(tool)
        if not tool.enabled_by_default:
            registry.disable(tool.name)
    return registry
