"""A workspace with things next to it that no tool may touch, and a registry of the tools."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from worker.tools import filesystem
from worker.tools.context import ToolContext
from worker.tools.registry import ToolRegistry
from worker.tools.search import SearchFilesTool, SearchTextTool
from worker.tools.session_context import SaveSessionContextTool
from worker.tools.weather import GetCurrentWeatherTool
from worker.tools.workspace import Workspace

#: Text of every file outside the workspace: it must never show up in an answer.
SECRET = "canary-secret-5d1e0b7a"
#: A name that exists only outside the workspace: no listing may show it.
MARKER = "zz-outside-marker-91f2"

Snapshot = dict[str, tuple[int, int, int, str]]


@dataclass(frozen=True)
class Layout:
    """``top/outer/base/ws`` is the workspace; everything else under ``top`` is off limits."""

    top: Path
    base: Path
    workspace_dir: Path
    sentinel: Path

    def snapshot(self) -> Snapshot:
        """Type, size, mtime and content digest of everything outside the workspace."""
        found: Snapshot = {}
        for dirpath, dirnames, filenames in os.walk(self.top):
            here = Path(dirpath)
            if here == self.base:
                dirnames[:] = [d for d in dirnames if here / d != self.workspace_dir]
            for name in [*dirnames, *filenames]:
                path = here / name
                info = path.lstat()
                digest = ""
                if stat.S_ISREG(info.st_mode):
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[str(path)] = (info.st_mode, info.st_size, info.st_mtime_ns, digest)
        return found


def make_layout(top: Path) -> Layout:
    base = top / "outer" / "base"
    workspace_dir = base / "ws"
    sentinel = base / "sentinel"
    for directory in (sentinel / "sub", base / "etc", workspace_dir):
        directory.mkdir(parents=True)
    for path in (
        sentinel / "canary.txt",
        sentinel / "secret.txt",
        sentinel / MARKER,
        sentinel / "sub" / "deep.txt",
        base / "etc" / "passwd",
        base / "etc" / "issue",
        base / "boot.ini",
        top / "outer" / "canary.txt",
    ):
        path.write_text(f"{SECRET}\n")
    return Layout(top, base, workspace_dir, sentinel)


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[Layout]:
    made = make_layout(tmp_path)
    before = made.snapshot()
    yield made
    assert made.snapshot() == before, "something outside the workspace changed"


@pytest.fixture
def workspace(layout: Layout) -> Workspace:
    return Workspace(layout.workspace_dir)


def make_registry(
    workspace: Workspace,
    context: ToolContext | None = None,
    *,
    sync_in_thread: bool = True,
    search_budget_s: float = 5.0,
) -> ToolRegistry:
    """Every tool of this package, all enabled (remove too)."""
    registry = ToolRegistry(sync_in_thread=sync_in_thread)
    for tool in (
        filesystem.ReadFileTool(workspace),
        filesystem.WriteFileTool(workspace),
        filesystem.ListDirTool(workspace),
        filesystem.MkdirTool(workspace),
        filesystem.RemoveTool(workspace),
        filesystem.MoveTool(workspace),
        SearchTextTool(workspace, time_budget_s=search_budget_s),
        SearchFilesTool(workspace, time_budget_s=search_budget_s),
        SaveSessionContextTool(context or ToolContext("You are a test."), workspace),
        GetCurrentWeatherTool(),
    ):
        registry.register(tool)
    return registry


@pytest.fixture
def registry(workspace: Workspace) -> ToolRegistry:
    return make_registry(workspace)


async def assert_arguments_refused(
    registry: ToolRegistry, tool: str, args: dict[str, object] | str, message: str
) -> None:
    """``tool`` refuses ``args`` as invalid arguments, saying ``message`` of them."""
    answer = await registry.execute(tool, args)
    assert answer.startswith(f"Error: invalid arguments for {tool}:"), answer
    assert message in answer, answer
