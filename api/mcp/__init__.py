"""The fleet's tools as an MCP server: ``toolq mcp`` (stdio) and ``/mcp`` on ``toolq serve``."""
