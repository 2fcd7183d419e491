"""The MCP servers a fleet hosts: the JSON file ``TOOLQ_MCP_SERVERS`` names.

A list of servers, each started by the workers of its pool over stdio::

    [{"name": "files", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
      "/srv/data"], "env": {}, "pool": "tools", "idempotent": false}]

Read with pydantic alone, so settings can check the file where the ``mcp`` package is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.contract.errors import McpConfigError, validation_problems
from worker.contract.wire import Pool

#: Between a server's name and its tool's in the name the fleet gives the tool.
SEPARATOR = "__"


class McpServerConfig(BaseModel):
    """One MCP server: how to start it, and which pool's workers host it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*(_[A-Za-z0-9-]+)*$",
        max_length=32,
        description="Its tools are offered as <name>__<tool>: letters, digits, - and single _.",
    )
    command: str = Field(min_length=1, description="The program that runs the server (stdio).")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Set over the few variables the SDK passes on (HOME, PATH, USER, ...).",
    )
    pool: Pool
    idempotent: bool = Field(
        False, description="Its tools are safe to run again when a worker died mid-call."
    )

    @field_validator("command", "args")
    @classmethod
    def _no_nul(cls, value: str | list[str]) -> str | list[str]:
        for part in [value] if isinstance(value, str) else value:
            if "\x00" in part:
                raise ValueError("contains a NUL byte, which no command line can hold")
        return value

    def tool_name(self, tool: str) -> str:
        """The fleet's name for the server's tool ``tool``."""
        return f"{self.name}{SEPARATOR}{tool}"


def load_servers(path: Path) -> list[McpServerConfig]:
    """The servers listed in ``path``; ``McpConfigError`` saying what is wrong and where."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise McpConfigError(f"cannot read the MCP servers file {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise McpConfigError(f"the MCP servers file {path} is not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise McpConfigError(
            f"the MCP servers file {path} must hold a JSON list of servers, "
            f"not a {type(raw).__name__}"
        )
    servers: list[McpServerConfig] = []
    for index, entry in enumerate(raw, start=1):
        label = f"server {index}"
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            label += f" ({entry['name']!r})"
        try:
            server = McpServerConfig.model_validate(entry)
        except ValidationError as exc:
            problems = validation_problems(exc, "entry")
            raise McpConfigError(f"{path}: {label}: {problems}") from None
        if any(known.name == server.name for known in servers):
            raise McpConfigError(f"{path}: {label}: another server has the name {server.name!r}")
        servers.append(server)
    return servers
