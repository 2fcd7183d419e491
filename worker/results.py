"""Results stored once per tool_call_id, and the start marker that makes redelivery safe."""

from __future__ import annotations

from typing import Any, cast

import redis

from worker import keys
from worker.protocol import ToolCallResult

# Store the result unless one exists, then push whichever is stored to the caller's inbox:
# a redelivered call that ran again still answers with the first outcome. (GET then SET rather
# than SET NX GET: the script is atomic either way, and this runs on Redis 6.2 too.)
_STORE_ONCE = """
local stored = redis.call('GET', KEYS[1])
if not stored then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
local answer = stored or ARGV[1]
if KEYS[2] ~= '' then
  redis.call('RPUSH', KEYS[2], answer)
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
return answer
"""


class ResultStore:
    """Sync access for workers; the caller side reads the same keys through redis.asyncio."""

    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._store = client.register_script(_STORE_ONCE)

    def get(self, tool_call_id: str) -> ToolCallResult | None:
        raw = self._redis.get(keys.result(tool_call_id))
        return ToolCallResult.model_validate_json(raw) if raw else None

    def store(self, result: ToolCallResult, reply_to: str | None) -> ToolCallResult:
        """Keep the first result for this call and send the kept one to ``reply_to``."""
        payload = result.model_dump_json()
        kept = self._store(
            keys=[keys.result(result.tool_call_id), reply_to or ""], args=[payload, self._ttl_s]
        )
        if kept == payload.encode() or kept == payload:
            return result
        return ToolCallResult.model_validate_json(cast(Any, kept))

    def reply_again(self, result: ToolCallResult, reply_to: str | None) -> None:
        if reply_to:
            pipe = self._redis.pipeline(transaction=False)
            pipe.rpush(reply_to, result.model_dump_json())
            pipe.expire(reply_to, self._ttl_s)
            pipe.execute()

    def claim_start(self, tool_call_id: str, worker: str) -> str | None:
        """Mark the call as started; returns the earlier worker's name if it was started before."""
        key = keys.started(tool_call_id)
        if self._redis.set(key, worker, nx=True, ex=self._ttl_s):
            return None
        previous = self._redis.get(key)
        if isinstance(previous, bytes):
            return previous.decode()
        return str(previous)
