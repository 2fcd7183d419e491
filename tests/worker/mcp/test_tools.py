"""An MCP tool as the worker's registry has it: arguments checked against the server's schema,
answers turned into text."""

from __future__ import annotations

import mcp_types as types

from worker.mcp.tools import arguments_model, result_text
from worker.tools.interface import ExecutableTool
from worker.tools.registry import validate_arguments

SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "times": {"type": "integer", "minimum": 1}},
    "required": ["text"],
}


class Shout(ExecutableTool):
    name = "demo__shout"
    description = "Shouts."
    Args = arguments_model("demo__shout", SCHEMA)

    def execute(self, args: dict[str, object]) -> str:
        return ""


def test_arguments_the_schema_accepts_pass_unchanged() -> None:
    assert validate_arguments(Shout(), '{"text": "hi", "times": 2}') == {"text": "hi", "times": 2}
    assert validate_arguments(Shout(), {"text": "hi"}) == {"text": "hi"}


def test_arguments_the_schema_refuses_are_all_named() -> None:
    refused = validate_arguments(Shout(), {"times": 0})
    assert isinstance(refused, str)
    assert refused.startswith("Error: invalid arguments for demo__shout: ")
    assert "'text' is a required property" in refused
    assert "times: 0 is less than the minimum of 1" in refused


def test_text_is_kept_and_other_content_described() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="first"),
            types.ImageContent(type="image", data="aGVsbG8h", mime_type="image/png"),
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(uri="file:///a.txt", text="inside"),
            ),
            types.ResourceLink(type="resource_link", uri="file:///b.bin", name="b"),
        ]
    )
    assert result_text(result).splitlines() == [
        "first",
        "[image content: image/png, about 6 bytes, not shown]",
        "inside",
        "[resource link: file:///b.bin]",
    ]


def test_structured_content_stands_in_for_missing_text() -> None:
    result = types.CallToolResult(content=[], structured_content={"sum": 3})
    assert result_text(result) == '{"sum": 3}'
