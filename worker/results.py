"""Results stored once per task_id, and the start marker that makes redelivery safe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.commands.core import Script
from redis.connection import Connection

from worker.protocol import ToolCallResult, keys

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


# One round trip before a call runs: its stored result if it finished, else the start marker
# (set now, or the name of the worker that set it before: the call was cut short there).
_BEGIN = """
local stored = redis.call('GET', KEYS[1])
if stored then return {'done', stored} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'EX', ARGV[2]) then return {'new', ''} end
return {'cut', redis.call('GET', KEYS[2]) or ''}
"""


@dataclass(frozen=True, slots=True)
class Begin:
    """How a delivery of a call starts: already answered, first run, or a run cut short."""

    stored: ToolCallResult | None = None
    #: The worker that started the call before (it died mid-call), when there was one.
    previous: str | None = None


class ResultStore:
    """Sync access for workers; the caller side reads the same keys through redis.asyncio."""

    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._store = client.register_script(_STORE_ONCE)
        self._begin = client.register_script(_BEGIN)

    def store(self, result: ToolCallResult, reply_to: str | None) -> ToolCallResult:
        """Keep the first result for this call and send the kept one to ``reply_to``."""
        payload = result.model_dump_json()
        kept = self._store(
            keys=[keys.result(result.task_id), reply_to or ""], args=[payload, self._ttl_s]
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

    def begin(self, task_id: str, worker: str) -> Begin:
        """The stored answer of a finished call, or mark the call started by ``worker``."""
        return self.begin_ahead(task_id, worker).result()

    def begin_ahead(self, task_id: str, worker: str) -> PendingBegin:
        """``begin`` sent now, its answer read by ``PendingBegin.result``: the round trip
        overlaps whatever the caller does in between, which must start nothing of the call's."""
        return PendingBegin(
            self._redis,
            self._begin,
            keys=[keys.result(task_id), keys.started(task_id)],
            args=[worker, self._ttl_s],
        )


class PendingBegin:
    """A call's ``begin`` on its way: the script's call written on a connection of its own,
    the answer read once, by ``result``.

    Where the connection fails, or the server does not know the script yet, ``result`` asks
    again through the client, as a script is always called (its retries, the script loaded);
    an exception while the answer is awaited drops the connection, whose next reply would
    otherwise be this one's."""

    def __init__(
        self, client: redis.Redis, script: Script, keys: list[str], args: list[str | int]
    ) -> None:
        self._client = client
        self._script = script
        self._keys = keys
        self._args = args
        self._begin: Begin | None = None
        self._connection: Connection | None = None
        try:
            self._connection = client.connection_pool.get_connection()
            self._connection.send_command(  # type: ignore[no-untyped-call]
                "EVALSHA", script.sha, len(keys), *keys, *args
            )
        except BaseException as exc:
            self._give_back(broken=True)
            if not isinstance(exc, redis.ConnectionError):
                raise

    def result(self) -> Begin:
        """How the call begins; the first call waits for the server's answer."""
        if self._begin is None:
            self._begin = _as_begin(self._read())
        return self._begin

    def discard(self) -> None:
        """The call ended before its answer was needed: the connection goes, unread."""
        self._give_back(broken=True)

    def _read(self) -> Any:
        connection = self._connection
        if connection is None:
            return self._ask_again()
        try:
            answer = connection.read_response()
        except (redis.ConnectionError, redis.TimeoutError):
            self._give_back(broken=True)
            return self._ask_again()
        except redis.exceptions.NoScriptError:
            self._give_back(broken=False)
            return self._ask_again()
        except BaseException:
            self._give_back(broken=True)
            raise
        self._give_back(broken=False)
        return answer

    def _ask_again(self) -> Any:
        """Through the client, as any script call: loaded if missing, with its retries."""
        return self._script(keys=self._keys, args=self._args)

    def _give_back(self, *, broken: bool) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if broken:
            connection.disconnect()  # type: ignore[no-untyped-call]
        self._client.connection_pool.release(connection)


def _as_begin(answer: Any) -> Begin:
    state, value = answer
    state = state.decode() if isinstance(state, bytes) else state
    if state == "done":
        return Begin(stored=ToolCallResult.model_validate_json(value))
    if state == "cut":
        return Begin(previous=value.decode() if isinstance(value, bytes) else str(value))
    return Begin()
