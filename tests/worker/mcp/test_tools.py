"""An MCP tool as the worker's registry has it: arguments checked against the server's schema,
answers turned into text."""

from __future__ import annotations

from typing import Any, cast

import mcp_types as types
import pytest

from worker.contract.mcp_servers import McpServerConfig
from worker.mcp.host import McpHost
from worker.mcp.tools import hosted_tool, result_text
from worker.tools.interface import ExecutableTool
from worker.tools.registry import validate_arguments

SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "times": {"type": "integer", "minimum": 1}},
    "required": ["text"],
}
SERVER = McpServerConfig(name="demo", command="demo-server", pool="tools", idempotent=True)


def shout(schema: dict[str, Any] = SCHEMA, name: str = "shout") -> ExecutableTool:
    listed = types.Tool(name=name, description="Shouts.", input_schema=schema)
    # No host: these tests look at the tool and never call it.
    return hosted_tool(SERVER, listed, cast(McpHost, None), wait_s=1.0)


def test_the_tool_is_the_servers_under_its_own_name() -> None:
    tool = shout()
    assert tool.name == "demo__shout"
    assert tool.pool == "tools"
    assert tool.idempotent
    assert tool.get_schema()["function"] == {
        "name": "demo__shout",
        "description": "Shouts.",
        "parameters": SCHEMA,
    }


def test_arguments_the_schema_accepts_pass_unchanged() -> None:
    tool = shout()
    assert validate_arguments(tool, '{"text": "hi", "times": 2}') == {"text": "hi", "times": 2}
    assert validate_arguments(tool, {"text": "hi"}) == {"text": "hi"}


def test_arguments_the_schema_refuses_are_all_named() -> None:
    refused = validate_arguments(shout(), {"times": 0})
    assert isinstance(refused, str)
    assert refused.startswith("Error: invalid arguments for demo__shout: ")
    assert "'text': Field required" in refused
    assert "'times': 0 is less than the minimum of 1" in refused


@pytest.mark.parametrize(
    ("schema", "name", "said"),
    [
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "shout", "not a valid JSON"),
        ({"type": "array"}, "shout", "must describe an object"),
        (SCHEMA, "shout.loud", "cannot name a tool"),
        (SCHEMA, "x" * 60, "cannot name a tool"),
    ],
)
def test_a_tool_no_model_api_takes_is_refused(schema: dict[str, Any], name: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        shout(schema, name)


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
