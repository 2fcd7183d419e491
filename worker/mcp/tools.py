"""An MCP server's tool as one of the worker's: named ``<server>__<tool>``, described and checked
by the JSON Schema the server gives (a tool made with ``worker.tools.functions.tool``), its answer
turned into text for the model."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from worker.contract.mcp_servers import McpServerConfig
from worker.exceptions import McpToolError
from worker.mcp.host import McpHost
from worker.tools.functions import tool
from worker.tools.interface import ExecutableTool


def hosted_tool(
    server: McpServerConfig, listed: types.Tool, host: McpHost, wait_s: float
) -> ExecutableTool:
    """The worker's tool for ``listed`` of ``server``, run by ``host``; a call waits at most
    ``wait_s`` (the call's soft time limit ends it sooner). ``ValueError`` when its name or its
    schema cannot be offered to a model API."""

    def call(**arguments: Any) -> str:
        result = host.call(server.name, listed.name, arguments, wait_s)
        text = result_text(result)
        if result.is_error:
            raise McpToolError(text or "the server reported an error without saying what")
        return text

    return tool(
        call,
        name=server.tool_name(listed.name),
        description=listed.description or listed.title or f"{listed.name} of {server.name}",
        parameters=listed.input_schema,
        pool=server.pool,
        idempotent=server.idempotent,
    )


def result_text(result: types.CallToolResult) -> str:
    """The call's content as the model reads it: text as it is, other content described."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            kind = "image" if isinstance(block, types.ImageContent) else "audio"
            size = len(block.data) * 3 // 4
            parts.append(f"[{kind} content: {block.mime_type}, about {size} bytes, not shown]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[binary resource {resource.uri} ({resource.mime_type}), not shown]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)
