"""MCP servers' tools, hosted on the workers: each server runs beside every worker process of
its pool, and its tools are the fleet's, named ``<server>__<tool>``."""
