"""The HTTP app's Redis connections: a bounded pool that requests wait their turn for, and how
long a blocking read may wait on it.
"""

from __future__ import annotations

import redis.asyncio as aioredis

#: Connections the app's store opens at most. A burst of requests (a thousand followers
#: connecting at once) waits for a free one instead of failing with "Too many connections".
STORE_CONNECTIONS = 100
#: Seconds a request waits for a free connection before it fails as Redis being unreachable.
CONNECTION_WAIT_S = 10.0
#: The longest one blocking read (XREAD BLOCK) waits for the server: well within the socket
#: timeout (redis-py's default is 5 s), so that Redis answers "nothing yet" before the socket
#: gives up on the read.
LONGEST_BLOCK_MS = 2000


def store_client(
    redis_url: str, *, connections: int = STORE_CONNECTIONS, wait_s: float = CONNECTION_WAIT_S
) -> aioredis.Redis:
    """A client of at most ``connections`` connections, each waited for up to ``wait_s`` when all
    are busy: the app's, unless told otherwise."""
    pool = aioredis.BlockingConnectionPool.from_url(
        redis_url, max_connections=connections, timeout=wait_s, health_check_interval=30
    )
    return aioredis.Redis.from_pool(pool)  # closing the client closes its pool


def bounded_block_ms(client: aioredis.Redis, wanted_ms: int) -> int:
    """``wanted_ms`` cut to what one blocking read on ``client`` may wait: at most
    ``LONGEST_BLOCK_MS``, and half the socket timeout when the Redis URL sets a shorter one."""
    timeout_s = client.connection_pool.connection_kwargs.get("socket_timeout")
    longest = LONGEST_BLOCK_MS
    if isinstance(timeout_s, int | float) and timeout_s > 0:
        longest = min(longest, int(timeout_s * 500))
    return max(1, min(wanted_ms, longest))
