"""A plugin tool with effects that waits for its call's admission itself, as run_bash does:
it prepares first, then asks whether it may start, then writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from worker.tools.context import ToolContext
from worker.tools.filesystem import WorkspaceTool
from worker.tools.registry import ToolRegistry
from worker.tools.runtime import admit_current_call
from worker.tools.workspace import Workspace


class LateWriteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class LateWriteTool(WorkspaceTool):
    """Notes that it prepared in <name>.prepared, then, once admitted, writes <name>."""

    name = "late_write"
    description = "Prepares, then writes a file once the call may start."
    Args: ClassVar[type[BaseModel]] = LateWriteArgs
    admits_itself = True

    def execute(self, args: dict[str, Any]) -> str:
        root = Path(self.workspace.root)
        (root / f"{args['name']}.prepared").touch()
        admit_current_call()
        (root / args["name"]).write_text("written")
        return "written"


def register(registry: ToolRegistry, context: ToolContext, workspace: Workspace) -> None:
    registry.register(LateWriteTool(workspace))
