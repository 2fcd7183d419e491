"""A caller's inbox: workers push answers to one Redis list per caller, and one reader drains it.

The dispatcher's tool calls and the conversation client's conversations both come back this
way: however many are in flight, they cost one connection and one task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

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
    """Hand every answer pushed to ``key`` to ``deliver`` until ``closing()``.

    On Redis 7 and later one BLMPOP per round takes every answer waiting, or waits for the
    next: one command however many came back together. Before that, BLPOP waits for one and,
    while another answer is awaited, LPOPs take what arrives next without blocking."""
    failures = 0
    blmpop = True
    draining = False
    batch: list[bytes | str]
    while not closing():
        try:
            if blmpop:
                found = await client.blmpop(1, 1, key, direction="LEFT", count=_DRAIN_BATCH)
                batch = [] if found is None else cast(list[bytes | str], found[1])
            elif draining:
                # Answers are coming back one after another: take all that arrived since the
                # last round trip, without blocking; only an empty list sends the reader back
                # to waiting.
                batch = await client.lpop(key, _DRAIN_BATCH) or []  # type: ignore[assignment]
            else:
                item = await client.blpop([key], timeout=1)
                batch = [] if item is None else [item[1]]
            for raw in batch:
                deliver(raw)
            # Look again at once only while another answer is awaited (those just delivered
            # are still listed): a lone call would pay for an empty LPOP every time.
            draining = bool(batch) and others_waiting()
            failures = 0
        except (RedisError, OSError) as exc:
            if blmpop and isinstance(exc, ResponseError) and "unknown command" in str(exc).lower():
                blmpop = False  # Redis before 7
                continue
            if closing():
                return
            # The result store restarted or the network blinked: keep trying; what still waits
            # falls back to its deadline and to the stored answer.
            failures += 1
            delay = RECONNECT.delay(failures)
            log.warning("reply reader: %s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
