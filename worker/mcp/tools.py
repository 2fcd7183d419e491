"""An MCP server's tool as one of the worker's: named ``<server>__<tool>``, its arguments checked
against the schema the server gives, its answer turned into text for the model."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import jsonschema
import mcp_types as types
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from worker.mcp.config import McpServerConfig
from worker.mcp.host import McpHost
from worker.protocol import function_tool
from worker.tools.interface import ExecutableTool


class McpToolError(RuntimeError):
    """The server answered the call with an error (``isError``); the message is its text."""


class McpTool(ExecutableTool):
    """Runs on the server this worker process keeps. Build one with ``McpTool.hosted``."""

    server: ClassVar[McpServerConfig]
    tool: ClassVar[types.Tool]

    def __init__(self, host: McpHost, wait_s: float) -> None:
        self._host = host
        self._wait_s = wait_s

    @classmethod
    def hosted(
        cls, server: McpServerConfig, tool: types.Tool, host: McpHost, wait_s: float
    ) -> McpTool:
        """The worker's tool for ``tool`` of ``server``; a call waits at most ``wait_s`` (the
        call's soft time limit ends it sooner)."""
        name = server.tool_name(tool.name)
        attrs: dict[str, Any] = {
            "server": server,
            "tool": tool,
            "name": name,
            "description": tool.description or tool.title or f"{tool.name} of {server.name}",
            "Args": arguments_model(name, tool.input_schema),
            "pool": server.pool,
            "idempotent": server.idempotent,
        }
        tool_class: type[McpTool] = type(f"Mcp_{name}", (cls,), attrs)
        return tool_class(host, wait_s)

    @classmethod
    def get_schema(cls) -> dict[str, Any]:
        return function_tool(cls.name, cls.description, cls.tool.input_schema)

    def execute(self, args: dict[str, Any]) -> str:
        result = self._host.call(self.server.name, self.tool.name, args, self._wait_s)
        text = result_text(result)
        if result.is_error:
            raise McpToolError(text or "the server reported an error without saying what")
        return text


def arguments_model(name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A model that takes any JSON object the server's input schema accepts, and refuses the
    rest naming every problem, so a bad call is answered as ``invalid_arguments``."""
    validator = jsonschema.validators.validator_for(schema)(schema)

    class Args(BaseModel):
        model_config = ConfigDict(extra="allow")

        @model_validator(mode="before")
        @classmethod
        def _matches_the_servers_schema(cls, data: Any) -> Any:
            try:
                problems = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
            except jsonschema.SchemaError as exc:
                message = f"the server's input schema is not valid: {exc.message}"
                raise PydanticCustomError("mcp_input_schema", message) from None
            if problems:
                message = "; ".join(_problem(error) for error in problems)
                raise PydanticCustomError("mcp_input_schema", message)
            return data

    Args.__name__ = f"{name}_Args"
    return Args


def _problem(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(part) for part in error.path)
    return f"{where}: {error.message}" if where else error.message


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
