"""The default tool set: the eleven built-in tools, remove, run_bash and bash_session
registered but off; and the fleet's, which adds the plugins."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES
from worker.contract.settings import WorkerSettings, get_worker_settings
from worker.sandbox import SandboxConfig
from worker.sandbox.volumes import ensure_volume
from worker.tools.bash import RunBashTool
from worker.tools.bash_session import BashSessionTool
from worker.tools.context import ToolContext
from worker.tools.filesystem import (
    ListDirTool,
    MkdirTool,
    MoveTool,
    ReadFileTool,
    RemoveTool,
    WriteFileTool,
)
from worker.tools.plugins import load_plugins, register_plugins
from worker.tools.registry import ToolRegistry
from worker.tools.search import SearchFilesTool, SearchTextTool
from worker.tools.session_context import SaveSessionContextTool
from worker.tools.workspace import Workspace


def prepare_workspace(folder: Path | str, sandbox: SandboxConfig) -> Workspace:
    """``folder`` (made if missing) as a workspace that run_bash's commands can write.

    When this process is root, commands run as the run's own uid (``worker.sandbox.identity``),
    or with runs sharing one uid as the sandbox user: the folder itself is given to that uid,
    never the folders above it, and whatever the tools create in it is theirs too. Files already
    in the folder keep their owner. With per-run uids the folder itself stays the worker's, open
    to the run's group alone (0770), and the workspace root above it lets no run list the others
    (0711).
    """
    owner = sandbox.workspace_owner(Path(folder))
    if owner is not None and sandbox.volume_bytes and sandbox.per_run_uids:
        ensure_volume(Path(os.path.realpath(folder)), sandbox.volume_bytes, owner[1])
    workspace = Workspace(folder, owner=owner)
    if owner is None:
        return workspace
    if sandbox.per_run_uids:
        # The worker's, in the run's group alone: the run's commands use it as their own, but
        # cannot open it to other runs (a chmod of it is not theirs to make).
        os.chown(workspace.root, os.geteuid(), owner[1])
        os.chmod(workspace.root, 0o770)  # noqa: S103 - the run's group alone
        _close_listing(workspace.root.parent, sandbox)
    else:
        os.chown(workspace.root, *owner)
    return workspace


def _close_listing(parent: Path, sandbox: SandboxConfig) -> None:
    """The workspace root may be passed through, not listed: a run learns no other run's name."""
    if sandbox.workspace_root is None or parent != Path(os.path.realpath(sandbox.workspace_root)):
        return
    if stat.S_IMODE(os.stat(parent).st_mode) != 0o711:
        os.chmod(parent, 0o711)  # noqa: S103 - passed through, never listed


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
    ``sandbox`` (by default the worker's settings) says how run_bash isolates its commands. A
    folder given as a path is prepared as the worker prepares a run's workspace (see
    ``prepare_workspace``); a ``Workspace`` is used as it is.
    """
    if sandbox is None:
        sandbox = SandboxConfig.from_settings(get_worker_settings())
    ws = workspace if isinstance(workspace, Workspace) else prepare_workspace(workspace, sandbox)
    registry = registry if registry is not None else ToolRegistry()
    cap = output_cap_bytes
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
        BashSessionTool(ws, replace(sandbox, output_cap_bytes=cap)),
    ):
        registry.register(tool)
        if not tool.enabled_by_default:
            registry.disable(tool.name)
    return registry


def create_fleet_tool_registry(
    settings: WorkerSettings,
    context: ToolContext,
    workspace: Workspace,
    registry: ToolRegistry | None = None,
) -> ToolRegistry:
    """The tools a worker with ``settings`` serves: the built-ins, then the plugins'
    (``TOOLQ_PLUGINS`` and the ``toolq.tools`` entry points, get_current_weather among them)."""
    registry = create_default_tool_registry(
        context,
        workspace,
        output_cap_bytes=settings.output_cap_bytes,
        sandbox=SandboxConfig.from_settings(settings),
        registry=registry,
    )
    register_plugins(load_plugins(tuple(settings.plugins)), registry, context, workspace)
    return registry
