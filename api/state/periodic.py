"""A step this replica takes again and again in the background while it serves, such as renewing
a lease; stopped by an event, not a cancellation, since redis-py on Python 3.11 can lose one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

log = logging.getLogger(__name__)


class Periodic:
    """Runs ``step`` every ``interval_s`` seconds from ``start`` until ``stop``. A step that
    fails on Redis is logged after ``failing`` and tried again at the next interval."""

    def __init__(
        self, step: Callable[[], Awaitable[None]], interval_s: float, *, name: str, failing: str
    ) -> None:
        self._step = step
        self._interval_s = interval_s
        self._name = name
        self._failing = failing
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._keep(), name=self._name)

    async def stop(self) -> None:
        """Ends the loop, a step under way first finishing."""
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _keep(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)
            if self._stopping.is_set():
                return
            try:
                await self._step()
            except (RedisError, OSError) as exc:
                log.warning("%s: %s", self._failing, exc)
