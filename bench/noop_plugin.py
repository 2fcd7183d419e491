"""A tool plugin with one tool that does nothing: what is measured is the cost of a call."""

from __future__ import annotations

from typing import Any

from worker.tools.context import ToolContext
from worker.tools.interface import ExecutableTool
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace

ANSWER = "ok"


class NoopTool(ExecutableTool):
    name = "noop"
    description = "Does nothing and answers 'ok'."
    idempotent = True

    def execute(self, args: dict[str, Any]) -> str:
        return ANSWER


def register(registry: ToolRegistry, context: ToolContext, workspace: Workspace) -> None:
    """The plugin hook: add the no-op tool to ``registry``."""
    registry.register(NoopTool())
