"""Cancel requests as the process running a run hears them: a message on the cancel channel,
and a look at the runs' cancel flags for messages missed while it was not subscribed."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection

from redis.exceptions import RedisError

from api.state.runs import RunStore
from worker.contract.keys import CANCEL_CHANNEL

log = logging.getLogger(__name__)


async def watch_cancels(
    store: RunStore,
    running: Callable[[], Collection[str]],
    cancel: Callable[[str], None],
    *,
    closing: Callable[[], bool],
    poll_s: float,
) -> None:
    """Call ``cancel(run_id)`` for each run asked to stop (it may name a run that is not among
    ``running()``: ``cancel`` decides), until ``closing()``; Redis going away is waited out."""
    delay = 0.1
    while not closing():
        try:
            async with store.redis.pubsub() as pubsub:
                await pubsub.subscribe(CANCEL_CHANNEL)
                checked = -math.inf  # the flags are looked at once subscribed, then every poll_s
                delay = 0.1
                while not closing():
                    if time.monotonic() - checked >= poll_s:
                        for run_id in await store.cancels_requested(list(running())):
                            cancel(run_id)
                        checked = time.monotonic()
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=poll_s
                    )
                    if message is not None:
                        data = message["data"]
                        cancel(data.decode() if isinstance(data, bytes) else data)
        except (RedisError, OSError) as exc:
            log.warning("cancel watcher: %s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
