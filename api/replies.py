"""A caller's inbox: workers push answers to one Redis list per caller, and one reader drains it.

The dispatcher's tool calls and the conversation client's conversations both come back this
way: however many are in flight, they cost one connection and one task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from api.backoff import Backoff

log = logging.getLogger(__name__)
_DRAIN_BATCH = 512
#: The pause before trying the broker or the result store again after failures in a row: short
#: enough that a blink costs little, growing so that an outage is not hammered.
RECONNECT = Backoff(first_s=0.1, cap_s=2.0)


async def read_replies(
    client: aioredis.Redis,
    key: str,
    deliver: Callable[[bytes | str], None],
    *,
    others_waiting: Callable[[], bool],
    closing: Callable[[], bool],
) -> None:
    """Hand every answer pushed to ``key`` to ``deliver`` until ``closing()``."""
    failures = 0
    while not closing():
        try:
            item = await client.blpop([key], timeout=1)
            if item is None:
                continue
            deliver(item[1])
            # Drain what else has arrived in one round trip, but only when another answer is
            # awaited (the one just delivered is still listed): a lone call would pay for an
            # empty LPOP every time.
            if others_waiting():
                more: list[bytes] = await client.lpop(key, _DRAIN_BATCH)  # type: ignore[assignment]
                for raw in more or []:
                    deliver(raw)
            failures = 0
        except (RedisError, OSError) as exc:
            if closing():
                return
            # The result store restarted or the network blinked: keep trying; what still waits
            # falls back to its deadline and to the stored answer.
            failures += 1
            delay = RECONNECT.delay(failures)
            log.warning("reply reader: %s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
