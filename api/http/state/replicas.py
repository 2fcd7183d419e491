"""This replica's lease, kept alive in the background, and the reaping of replicas that died."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.exceptions import RedisError

from api.http.state.store import ApiStore

log = logging.getLogger(__name__)


class ReplicaLease:
    """Keeps this replica's lease alive, and fails the work of replicas whose lease expired."""

    def __init__(self, store: ApiStore, replica: str) -> None:
        self._store = store
        self.replica = replica
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        await self._store.renew_lease(self.replica)
        self._task = asyncio.create_task(self._keep(), name="toolq-lease")

    async def stop(self) -> None:
        # An event, not a cancellation: redis-py on Python 3.11 can lose a cancellation.
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        with contextlib.suppress(RedisError, OSError):  # it expires by itself
            await self._store.drop_lease(self.replica)

    async def _keep(self) -> None:
        interval = self._store.lease_ttl_s / 3
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
            if self._stopping.is_set():
                return
            try:
                await self._store.renew_lease(self.replica)
                reaped = await self._store.reap_orphans()
                if reaped:
                    log.warning("marked %d runs or batches of stopped replicas as failed", reaped)
            except (RedisError, OSError) as exc:
                log.warning("replica lease: %s", exc)
