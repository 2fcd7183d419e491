"""save_session_context: what it writes, where, and that it reads the context when called."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.worker.tools.conftest import Layout, make_registry
from worker.tools.context import ToolContext, ToolContextSnapshot
from worker.tools.session_context import SaveSessionContextTool
from worker.tools.workspace import Workspace

CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Plan the trip. ☀️"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
]


def test_tool_flags(workspace: Workspace) -> None:
    assert SaveSessionContextTool.name == "save_session_context"
    assert SaveSessionContextTool.idempotent is False
    made = SaveSessionContextTool(ToolContext(source=ToolContextSnapshot), workspace)
    schema = made.get_schema()["function"]["parameters"]
    assert schema["required"] == ["reason"]
    assert schema["properties"]["reason"]["description"]


async def test_saves_prompt_conversation_reason_and_time(workspace: Workspace) -> None:
    context = ToolContext("You plan trips.", list(CONVERSATION), "memory/ctx.json")
    registry = make_registry(workspace, context)
    answer = await registry.execute("save_session_context", '{"reason": "before a long step"}')
    assert answer == "Saved the session context (2 messages) to memory/ctx.json."
    saved = json.loads((workspace.root / "memory" / "ctx.json").read_text(encoding="utf-8"))
    assert set(saved) == {"reason", "system_prompt", "session_context", "saved_at"}
    assert saved["reason"] == "before a long step"
    assert saved["system_prompt"] == "You plan trips."
    assert saved["session_context"] == CONVERSATION
    saved_at = datetime.fromisoformat(saved["saved_at"])
    assert saved_at.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - saved_at) < timedelta(minutes=1)


async def test_reads_the_context_when_called(workspace: Workspace) -> None:
    context = ToolContext("first prompt", [], "first.json")
    tool = SaveSessionContextTool(context, workspace)
    context.system_prompt = "second prompt"
    context.session_context = [{"role": "user", "content": "later"}]
    context.session_context_file_path = "second.json"
    assert tool.execute({"reason": "r"}) == "Saved the session context (1 message) to second.json."
    saved = json.loads((workspace.root / "second.json").read_text())
    assert saved["system_prompt"] == "second prompt"
    assert not (workspace.root / "first.json").exists()


async def test_reads_a_live_source(workspace: Workspace) -> None:
    current = ToolContextSnapshot(system_prompt="live", session_context_file_path="live.json")
    context = ToolContext(source=lambda: current)
    tool = SaveSessionContextTool(context, workspace)
    current = ToolContextSnapshot(system_prompt="newer", session_context_file_path="newer.json")
    tool.execute({"reason": "r"})
    assert json.loads((workspace.root / "newer.json").read_text())["system_prompt"] == "newer"


@pytest.mark.parametrize(
    ("file_path", "message"),
    [
        ("../escape.json", "leads outside the workspace"),
        ("/tmp/escape.json", "outside the workspace"),
        ("out/escape.json", "leads outside the workspace through a symbolic link"),
        (".", "names a directory"),
        ("dir/", "names a directory"),
        ("a\x00.json", "NUL byte"),
    ],
)
async def test_refuses_a_file_path_that_is_not_a_file_inside(
    workspace: Workspace, layout: Layout, file_path: str, message: str
) -> None:
    (workspace.root / "out").symlink_to(layout.sentinel)
    registry = make_registry(workspace, ToolContext("p", [], file_path))
    answer = await registry.execute("save_session_context", {"reason": "r"})
    assert answer.startswith("Error executing save_session_context:") and message in answer
    assert sorted(p.name for p in workspace.root.iterdir()) == ["out"]


async def test_odd_text_is_kept_as_valid_json(workspace: Workspace) -> None:
    context = ToolContext("prompt \ud800 with a lone surrogate", [{"content": "\x00 nul"}])
    registry = make_registry(workspace, context)
    answer = await registry.execute("save_session_context", {"reason": "ünïcödé \U0001f600"})
    assert answer.startswith("Saved"), answer
    saved = json.loads((workspace.root / "session_context.json").read_bytes().decode("utf-8"))
    assert saved["reason"] == "ünïcödé \U0001f600"
    assert saved["system_prompt"] == "prompt \ud800 with a lone surrogate"
    assert saved["session_context"] == [{"content": "\x00 nul"}]


async def test_a_missing_reason_is_named(workspace: Workspace) -> None:
    registry = make_registry(workspace)
    answer = await registry.execute("save_session_context", {})
    assert answer == "Error: invalid arguments for save_session_context: 'reason': Field required."
    assert list(workspace.root.iterdir()) == []
