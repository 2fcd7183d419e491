"""Every Redis key both sides read and write, named once."""

from __future__ import annotations


class RedisKeys:
    """Every Redis key workers and callers share, in one place."""

    PREFIX = "toolq"
    #: Hash of tool name -> ToolSpec JSON, written by workers with every heartbeat.
    MANIFEST = f"{PREFIX}:manifest"
    REPLY_PREFIX = f"{PREFIX}:reply:"

    @staticmethod
    def result(task_id: str) -> str:
        """The one stored answer to a call: first write wins."""
        return f"{RedisKeys.PREFIX}:result:{task_id}"

    @staticmethod
    def started(task_id: str) -> str:
        """Set when a worker begins a call (``start_mark``): a second delivery finds it and knows
        the first was cut. Set by the caller when it stops waiting for a call never started,
        which then never starts."""
        return f"{RedisKeys.PREFIX}:started:{task_id}"

    @staticmethod
    def reply(dispatcher_id: str) -> str:
        """A caller's inbox: workers push answers here, one reader drains it."""
        return f"{RedisKeys.REPLY_PREFIX}{dispatcher_id}"

    @staticmethod
    def is_reply(key: str) -> bool:
        return key.startswith(RedisKeys.REPLY_PREFIX)

    @staticmethod
    def worker_heartbeat(pool: str, worker: str) -> str:
        """A live worker's WorkerInfo, expiring unless refreshed."""
        return f"{RedisKeys.PREFIX}:worker:{pool}:{worker}"

    @staticmethod
    def worker_heartbeats(pool: str) -> str:
        """Pattern matching every live worker of a pool."""
        return f"{RedisKeys.PREFIX}:worker:{pool}:*"


keys = RedisKeys()
