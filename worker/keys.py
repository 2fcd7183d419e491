"""Every Redis key toolq writes, in one place."""

from __future__ import annotations

PREFIX = "toolq"
#: Hash of tool name -> JSON spec, written by workers when they start.
MANIFEST = f"{PREFIX}:manifest"


def result(tool_call_id: str) -> str:
    """The one stored answer to a call: first write wins."""
    return f"{PREFIX}:result:{tool_call_id}"


def started(tool_call_id: str) -> str:
    """Set when a worker begins a call: a second delivery finds it and knows the first was cut."""
    return f"{PREFIX}:started:{tool_call_id}"


def reply(dispatcher_id: str) -> str:
    """A caller's inbox: workers push answers here, one reader drains it."""
    return f"{PREFIX}:reply:{dispatcher_id}"


def worker_heartbeat(pool: str, worker: str) -> str:
    return f"{PREFIX}:worker:{pool}:{worker}"


def worker_heartbeats(pool: str) -> str:
    """Pattern matching every live worker of a pool."""
    return f"{PREFIX}:worker:{pool}:*"
