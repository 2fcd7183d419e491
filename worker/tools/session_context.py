"""save_session_context: write the agent's prompt and conversation to a file in the workspace."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import Field
from pydantic_core import PydanticSerializationError, to_jsonable_python

from worker.exceptions import WorkspaceError
from worker.tools.context import ToolContext
from worker.tools.interface import ExecutableTool, ToolArgs
from worker.tools.paths import counted, shown
from worker.tools.workspace import Workspace


class SaveSessionContextArgs(ToolArgs):
    reason: str = Field(description="Why the session context is being saved; stored with it.")


class SaveSessionContextTool(ExecutableTool):
    name = "save_session_context"
    description = (
        "Save the current system prompt and conversation, with a reason, as JSON to the "
        "session context file in the workspace."
    )
    Args = SaveSessionContextArgs
    workspace_effect = "adds"

    def __init__(self, context: ToolContext, workspace: Workspace) -> None:
        self.context = context
        self.workspace = workspace

    def execute(self, args: dict[str, Any]) -> str:
        # Read through the context's properties now: it may have changed since construction.
        file_path = self.context.session_context_file_path
        target = self.workspace.resolve(file_path)
        if self.workspace.is_root(target) or file_path.endswith("/"):
            raise WorkspaceError(
                f"the session context file path {shown(file_path)} names a directory"
            )
        messages = self.context.session_context
        document = {
            "reason": args["reason"],
            "system_prompt": self.context.system_prompt,
            "session_context": messages,
            "saved_at": datetime.now(UTC).isoformat(),
        }
        try:
            text = json.dumps(document, ensure_ascii=False, indent=2, default=to_jsonable_python)
        except (TypeError, ValueError, PydanticSerializationError) as exc:
            raise ValueError(f"the session context cannot be saved as JSON: {exc}") from None
        # A lone surrogate can only sit inside a JSON string, where '\udXXX' is a valid escape.
        self.workspace.write_file(target, text.encode("utf-8", "backslashreplace"))
        where = self.workspace.relative(target)
        saved = counted(len(messages), "message")
        return f"Saved the session context ({saved}) to {where}."
