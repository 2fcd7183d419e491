"""Scripted-model conversations shared by the tests that run `toolq batch`."""

from __future__ import annotations

from typing import Any

#: Each conversation writes a note and reads it back: two tool calls, two model turns.
WRITE_THEN_READ: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "note.txt", "content": "{prompt}"}}
        ]
    },
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "note.txt"}}]},
    {"content": "Read back: {last_tool_result}"},
]
