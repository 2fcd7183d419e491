"""This replica's lease, kept alive in the background, and the reaping of replicas that died."""

from __future__ import annotations

import contextlib
import logging

from redis.exceptions import RedisError

from api.state.periodic import Periodic
from api.state.store import ApiStore

log = logging.getLogger(__name__)


class ReplicaLease:
    """Keeps this replica's lease alive, and fails the work of replicas whose lease expired."""

    def __init__(self, store: ApiStore, replica: str) -> None:
        self._store = store
        self.replica = replica
        self._keeper = Periodic(
            self._renew, store.lease_ttl_s / 3, name="toolq-lease", failing="replica lease"
        )

    async def start(self) -> None:
        await self._store.renew_lease(self.replica)
        self._keeper.start()

    async def stop(self) -> None:
        await self._keeper.stop()
        with contextlib.suppress(RedisError, OSError):  # it expires by itself
            await self._store.drop_lease(self.replica)

    async def _renew(self) -> None:
        await self._store.renew_lease(self.replica)
        reaped = await self._store.reap_orphans()
        if reaped:
            log.warning("marked %d runs or batches of stopped replicas as failed", reaped)
